"""The `train_chars` model in PyTorch, and a check that it reproduces Tapir's logits.

    python3 gpt_torch.py [DIR]     # DIR: the example's output (default target/train_chars)

Builds the same GPT (pre-norm blocks, exact GELU, LayerNorm eps 1e-5, output projection
tied to the token embedding), loads Tapir's checkpoint `DIR/chars.safetensors`, runs the
fixed input stored in `DIR/chars_check.safetensors` (two validation windows of 64
characters) and compares the logits with Tapir's, stored beside it. Tapir stores a linear
layer's weight input-major (`[in, out]`, `y = x·W + b`); PyTorch's `nn.Linear` holds
`[out, in]`, so those weights are transposed on load; every other tensor is used as is.

`benches/compare/torch_peer.py` imports `Gpt` from here for benchmark W10.
"""

import math
import sys

import torch
from torch import nn
from torch.nn import functional as F


class Attention(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class Block(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.ln1 = nn.LayerNorm(dim, eps=1e-5)
        self.attn = Attention(dim, heads)
        self.ln2 = nn.LayerNorm(dim, eps=1e-5)
        self.fc1 = nn.Linear(dim, 4 * dim)
        self.fc2 = nn.Linear(4 * dim, dim)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class Gpt(nn.Module):
    """GPT-2's initialisation, as `tapir_nn::Gpt::new`: N(0, 0.02^2) weights, residual
    projections N(0, (0.02/sqrt(2 layers))^2), zero biases, LayerNorms at 1 and 0."""

    def __init__(self, vocab=96, context=64, dim=128, heads=4, layers=4):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.zeros(context, dim))
        self.h = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(dim, eps=1e-5)
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif ".ln" in name or name.startswith("ln_f"):
                nn.init.ones_(p)
            elif name.endswith("attn.proj.weight") or name.endswith("fc2.weight"):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * layers))
            else:
                nn.init.normal_(p, std=0.02)

    def forward(self, tokens):
        h = self.tok(tokens) + self.pos[: tokens.shape[1]]
        for block in self.h:
            h = block(h)
        return self.ln_f(h) @ self.tok.weight.t()

    def load_tapir(self, tensors):
        """Loads a Tapir checkpoint (name -> tensor), transposing linear weights."""
        own = dict(self.named_parameters())
        names = {"tok.weight": "tok.weight", "pos.weight": "pos"}
        for name in tensors:
            if name not in names:
                names[name] = name
        if set(names.values()) != set(own):
            raise ValueError(f"checkpoint names {sorted(names.values())} differ from the model's {sorted(own)}")
        with torch.no_grad():
            for name, value in tensors.items():
                target = own[names[name]]
                linear = name.endswith(".weight") and any(k in name for k in ("qkv", "proj", "fc1", "fc2"))
                value = value.t() if linear else value
                if value.shape != target.shape:
                    raise ValueError(f"{name}: checkpoint {tuple(value.shape)} vs model {tuple(target.shape)}")
                target.copy_(value)


def main():
    from safetensors.torch import load_file

    out = sys.argv[1] if len(sys.argv) > 1 else "target/train_chars"
    torch.set_grad_enabled(False)
    model = Gpt()
    model.load_tapir(load_file(f"{out}/chars.safetensors"))
    model.eval()
    check = load_file(f"{out}/chars_check.safetensors")
    tokens = check["tokens"].round().long()
    want = check["logits"]
    got = model(tokens)
    diff = (got - want).abs().max().item()
    print(f"torch {torch.__version__}, {sum(p.numel() for p in model.parameters())} parameters")
    print(f"input {tuple(tokens.shape)} tokens; logits {tuple(got.shape)}")
    print(f"max |logit_torch - logit_tapir| = {diff:.3e} (tolerance 1e-4)")
    loss = F.cross_entropy(got[:, :-1].reshape(-1, got.shape[-1]), tokens[:, 1:].reshape(-1)).item()
    print(f"torch cross-entropy of the input's next characters: {loss:.4f} nats/char")
    if not diff <= 1e-4:
        print("FAIL")
        sys.exit(1)
    print("OK: PyTorch reproduces Tapir's logits")


if __name__ == "__main__":
    main()
