//! The plan of a per-example pass: every node's [`Flow`], the boundaries, and the
//! refusals (see the [module](super)).

use crate::dtype::Float;
use crate::engine::per_example::{aligned, rules, Boundary, Flow, Plan};
use crate::error::{Error, Loc, Result};
use crate::kernels::binary_fn::BinaryFn;
use crate::kernels::unary_fn::UnaryFn;
use crate::record::handles::State;
use crate::shape::Shape;
use crate::tape::id::NodeId;
use crate::tape::op::Op;

/// The flows of every node up to `loss` and the boundaries, or the error naming the op
/// that cannot be split. `examples` hold the `batch` examples on axis 0 (as many rows
/// each); `roots` are
/// leaves, each with the index of the parameter it holds (of `shapes.len()`).
pub(crate) fn plan<'s, T: Float>(
    tape: &State<'s, T>,
    loss: NodeId<'s>,
    (batch, examples): (usize, &[NodeId<'s>]),
    (roots, shapes): (Vec<(NodeId<'s>, usize)>, Vec<Shape>),
    location: Loc,
) -> Result<Plan<'s>> {
    const OP: &str = "per_example";
    let fail = |culprit: &'static str, inputs: Vec<Shape>, detail: String| Error::PerExampleUnsupported {
        culprit,
        inputs,
        detail,
        location,
    };
    if examples.is_empty() || batch == 0 {
        return Err(fail(
            OP,
            vec![],
            format!("needs a positive batch size (got {batch}) and at least one value holding the examples"),
        ));
    }
    for (i, &x) in examples.iter().enumerate() {
        let s = tape.shape(x);
        if s.rank() == 0 || s.dim(0) % batch != 0 {
            return Err(fail(
                tape.name_of(&tape.node(x).op),
                vec![s],
                format!("example value #{i} must hold the {batch} examples on axis 0, a whole number of rows each"),
            ));
        }
    }
    for &(p, i) in &roots {
        let node = tape.node(p);
        if !matches!(node.op, Op::Leaf | Op::Variable | Op::Param(_)) || !node.requires_grad {
            return Err(fail(
                tape.name_of(&node.op),
                vec![node.shape],
                format!("parameter #{i} must be a gradient-requesting leaf or parameter"),
            ));
        }
    }
    // Which nodes the loss reads, directly or not: ops beside the loss (an accuracy, a
    // batch statistic) may combine examples freely.
    let n = loss.index() + 1;
    let mut needed = vec![false; n];
    needed[loss.index()] = true;
    for id in tape.ids_through(loss).rev() {
        if needed[id.index()] {
            let op = tape.nodes[id.index()].op;
            tape.for_each_input(&op, |x| needed[x.index()] = true);
        }
    }
    // A node recorded after the loss does not affect it.
    let mut roots = roots;
    roots.retain(|r| r.0.index() < n);
    let mut flows = vec![Flow::Const; n];
    let mut root = vec![usize::MAX; n];
    for &(p, i) in &roots {
        flows[p.index()] = Flow::Free;
        root[p.index()] = i;
    }
    for &x in examples.iter().filter(|x| x.index() < n) {
        flows[x.index()] = Flow::Major;
    }
    let mut boundaries = vec![];
    for id in tape.ids_through(loss) {
        let node = tape.node(id);
        if !needed[id.index()] || matches!(node.op, Op::Leaf | Op::Variable | Op::Param(_)) {
            continue;
        }
        let mut inputs = vec![];
        tape.for_each_input(&node.op, |x| inputs.push(x));
        let of = |x: NodeId<'s>| flows[x.index()];
        let has = |f: Flow| inputs.iter().any(|&x| of(x) == f);
        let shapes = || inputs.iter().map(|&x| tape.shape(x)).collect::<Vec<_>>();
        let name = tape.name_of(&node.op);
        // An op listed as an example source (an embedding lookup of the batch's tokens)
        // holds the examples whatever it reads.
        let flow = if examples.contains(&id) {
            Flow::Major
        } else if has(Flow::Reduced) {
            if has(Flow::Major) || has(Flow::Free) || !after_reduction(&node.op, of) {
                return Err(fail(name, shapes(), combined_detail(has(Flow::Major), has(Flow::Free))));
            }
            Flow::Reduced
        } else if has(Flow::Major) {
            match major(tape, &node.op, node.shape, batch, of) {
                Ok(flow) => flow,
                Err(detail) => return Err(fail(name, shapes(), detail)),
            }
        } else if has(Flow::Free) && node.requires_grad {
            Flow::Free
        } else {
            Flow::Const
        };
        // A node that needs no gradient (`no_grad`, `detach`) cuts the parameters off: only
        // whether it holds examples matters.
        if !node.requires_grad {
            flows[id.index()] = if flow == Flow::Free { Flow::Const } else { flow };
            continue;
        }
        flows[id.index()] = flow;
        match flow {
            Flow::Free => {
                // One parameter per parameter-only node: the root its gradient goes to.
                let roots: Vec<usize> =
                    inputs.iter().filter(|&&x| flows[x.index()] == Flow::Free).map(|x| root[x.index()]).collect();
                root[id.index()] = roots[0];
                if roots.len() > 1 || !matches!(node.op, Op::Reshape { .. } | Op::Permute { .. }) {
                    // Reported only if the examples read it (below), as a boundary.
                    root[id.index()] = usize::MAX;
                }
            }
            Flow::Major => {
                for &x in inputs.iter().filter(|&&x| flows[x.index()] == Flow::Free) {
                    if root[x.index()] == usize::MAX {
                        return Err(fail(
                            tape.name_of(&tape.node(x).op),
                            vec![tape.shape(x)],
                            "a parameter reaches the examples through an op that mixes parameters or is not a \
                             reshape or permute; per-example gradients follow a parameter through reshape and \
                             permute only"
                                .into(),
                        ));
                    }
                    if !rules::has_rule(tape, &node.op, node.shape, x) {
                        return Err(fail(
                            name,
                            shapes(),
                            "no per-example rule for a parameter input of this op (rules: linear, matmul, \
                             add, sub, mul, div, layer_norm, index_select on axis 0), or the parameter is \
                             aligned with the batch axis"
                                .into(),
                        ));
                    }
                    boundaries.push(Boundary { v: id, p: x, param: root[x.index()] });
                }
            }
            _ => {}
        }
    }
    match flows[loss.index()] {
        Flow::Reduced => {}
        Flow::Major if batch == 1 && tape.shape(loss).numel() == 1 => {}
        _ => {
            return Err(fail(
                tape.name_of(&tape.node(loss).op),
                vec![tape.shape(loss)],
                "the loss must be one number summed or averaged over the examples".into(),
            ))
        }
    }
    let mut free: Vec<NodeId<'s>> = vec![];
    let mut gets = vec![false; n];
    for b in &boundaries {
        gets[b.p.index()] = true;
    }
    for id in tape.ids_through(loss).rev() {
        if gets[id.index()] && !roots.iter().any(|r| r.0 == id) {
            if let Op::Reshape { x } | Op::Permute { x, .. } = tape.nodes[id.index()].op {
                gets[x.index()] = true;
                free.push(id);
            }
        }
    }
    Ok(Plan { batch, roots, shapes, boundaries, free, flows })
}

/// The error's text when an op reads a combination over the examples.
fn combined_detail(major: bool, free: bool) -> String {
    if major {
        "this op reads a value combined over the examples beside one that is not: examples must stay \
         separate until the loss"
            .into()
    } else if free {
        "a term of the loss depends on parameters and on no example; add it (weight decay, a penalty) \
         outside the per-example transform"
            .into()
    } else {
        "a nonlinear op after the examples were combined: the loss must be a sum or mean over the \
         examples (followed only by sums, scaling and constants)"
            .into()
    }
}

/// Whether `op`, reading a combination over the examples (and constants), keeps it a
/// linear combination.
fn after_reduction<'s, T: Float>(op: &Op<'s, T>, flow: impl Fn(NodeId<'s>) -> Flow) -> bool {
    match *op {
        Op::Unary { f, .. } => matches!(f, UnaryFn::Neg | UnaryFn::AddScalar | UnaryFn::MulScalar),
        Op::Binary { f: BinaryFn::Add | BinaryFn::Sub, .. } => true,
        Op::Binary { f: BinaryFn::Mul, a, b } => flow(a) == Flow::Const || flow(b) == Flow::Const,
        Op::Binary { f: BinaryFn::Div, b, .. } => flow(b) == Flow::Const,
        Op::Sum { .. } | Op::SumAxis { .. } | Op::Reshape { .. } => true,
        _ => false,
    }
}

/// The flow of an op reading at least one batch-major input (and no combination), or why
/// it combines the examples.
fn major<'s, T: Float>(
    tape: &State<'s, T>,
    op: &Op<'s, T>,
    out: Shape,
    batch: usize,
    flow: impl Fn(NodeId<'s>) -> Flow,
) -> std::result::Result<Flow, String> {
    let is_major = |x: NodeId<'s>| flow(x) == Flow::Major;
    let rows = |s: Shape| s.rank() > 0 && s.dim(0) % batch == 0;
    let axis0 = |axis: u8, what: &str| {
        if axis == 0 {
            Err(format!("{what} along axis 0, the batch axis, combines examples"))
        } else {
            Ok(Flow::Major)
        }
    };
    let need = |ok: bool, what: &str| if ok { Ok(Flow::Major) } else { Err(what.to_string()) };
    match *op {
        Op::Leaf | Op::Variable | Op::Param(_) => Ok(Flow::Const),
        Op::Unary { .. } | Op::AttentionWeights { .. } | Op::Attend { .. } => Ok(Flow::Major),
        Op::Binary { a, b, .. } | Op::Where { a, b, .. } => {
            let ok = [a, b].iter().all(|&x| !is_major(x) || aligned(tape.shape(x), out)) && rows(out);
            need(ok, "a batch-major operand is broadcast along the batch axis")
        }
        Op::MatMul { a, b, ta, .. } => {
            let (sa, sb) = (tape.shape(a), tape.shape(b));
            let ok = match (is_major(a), is_major(b)) {
                // Rows of `a` (a 2-D `a` used transposed contracts them).
                (true, false) => aligned(sa, out) && (sa.rank() > 2 || !ta),
                // A batched product over the examples.
                (false, true) => sb.rank() > 2 && aligned(sb, out),
                _ => sa.rank() > 2 && aligned(sa, out) && aligned(sb, out),
            };
            need(ok && rows(out), "a product that contracts or broadcasts the batch axis combines examples")
        }
        Op::Linear { x, .. } => need(is_major(x) && rows(out), "linear's weight or bias holds examples"),
        Op::LayerNorm { .. } => need(out.rank() > 1 && rows(out), "a layer norm over the batch axis"),
        Op::Reshape { .. } => need(rows(out), "a reshape that does not keep the batch leading"),
        Op::Permute { axes, .. } => need(axes[0] == 0, "a permute that moves the batch axis"),
        Op::BroadcastTo { x } => need(aligned(tape.shape(x), out), "a broadcast along the batch axis"),
        Op::Narrow { axis, .. } => axis0(axis, "a narrow"),
        Op::Concat { axis, .. } => axis0(axis, "a concatenation"),
        Op::IndexSelect { x, axis, .. } => {
            if is_major(x) {
                axis0(axis, "an index_select")
            } else {
                need(rows(out), "an index_select whose output does not hold the examples' rows")
            }
        }
        Op::Sum { .. } | Op::CrossEntropy { .. } | Op::NllLoss { .. } | Op::BceWithLogits { .. } => Ok(Flow::Reduced),
        Op::SumAxis { axis, .. } => Ok(if axis == 0 { Flow::Reduced } else { Flow::Major }),
        Op::MaxAxis { axis, .. } => axis0(axis, "a max"),
        Op::MinAxis { axis, .. } => axis0(axis, "a min"),
        Op::LogSumExp { axis, .. } => axis0(axis, "a logsumexp"),
        Op::Softmax { axis, .. } => axis0(axis, "a softmax"),
        Op::LogSoftmax { axis, .. } => axis0(axis, "a log_softmax"),
        Op::Pad { axis, .. } => axis0(axis, "a pad"),
        Op::ScatterAdd { axis, .. } => axis0(axis, "a scatter_add"),
        Op::Im2Col { .. } | Op::MaxPool2d { .. } | Op::AvgPool2d { .. } | Op::Col2Im { .. } => Ok(Flow::Major),
        Op::Custom { .. } | Op::Checkpoint { .. } => {
            Err("custom ops and checkpointed blocks have no per-example rule; record the block's ops directly".into())
        }
    }
}
