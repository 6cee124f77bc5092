"""Breaks each scope rule once and prints what the user sees (docs/python.md quotes it)."""
import numpy as np, tapir
g = tapir.Graph()
store = tapir.ParamStore()
store.add("w", np.zeros((3, 2), np.float32))
opt = tapir.optim.SGD(store, 0.1)
grads = store.zeros_like()
kept = []
for step in range(2):
    with g.scope() as s:
        x = s.input(np.ones((4, 3), np.float32))
        loss = (x @ s.param(store, "w")).square().mean()
        kept.append(loss)
        s.backward_into(loss, grads)
    opt.step(store, grads)
def show(f):
    try:
        f()
    except tapir.TapirError as e:
        print(f"{type(e).__name__}: {e}")
show(lambda: kept[0].item())
def mismatch():
    with g.scope() as s:
        a = s.input(np.ones((4, 3), np.float32))
        a @ a
show(mismatch)
def wrong_dtype():
    with g.scope() as s:
        s.leaf(np.ones(3))
show(wrong_dtype)
def step_inside():
    with g.scope() as s:
        s.param(store, "w")
        opt.step(store, grads)
show(step_inside)
def other_graph():
    h = tapir.Graph()
    with g.scope() as s, h.scope() as t:
        s.input(np.ones(2, np.float32)) + t.input(np.ones(2, np.float32))
show(other_graph)
def twice():
    with g.scope() as s:
        x = s.leaf(np.ones(2, np.float32))
        y = x.sum()
        s.backward(y)
        s.backward(y)
show(twice)
