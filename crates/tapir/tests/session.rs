//! `Session`: a scope opened and closed by calls, with nodes held by index between them,
//! as the Python binding holds them. Gradients are checked against closed forms.

use tapir::{Error, Graph, ParamStore, Session, Tensor};

#[test]
fn a_scope_across_calls_differentiates_like_a_closure() {
    // y = sum(w ⊙ x)², dy/dw = 2·(w·x)·x, dy/dx = 2·(w·x)·w.
    let (w, x) = ([1.0, -2.0, 0.5], [3.0, 1.0, 4.0]);
    let dot: f64 = w.iter().zip(&x).map(|(a, b)| a * b).sum();
    let mut session = Session::new(Graph::<f64>::new());
    for _ in 0..3 {
        assert!(session.open());
        let wi = session.with(|s| s.variable(&w, &[3]).index()).unwrap();
        let xi = session.with(|s| s.variable(&x, &[3]).index()).unwrap();
        let yi = session.with(|s| (s.var_at(wi).unwrap() * s.var_at(xi).unwrap()).sum().square().index()).unwrap();
        let (dw, dx) = session
            .with(|s| {
                s.backward(s.var_at(yi).unwrap()).unwrap();
                let grad = |i| s.var_at(i).unwrap().grad().unwrap().to_vec();
                (grad(wi), grad(xi))
            })
            .unwrap();
        for k in 0..3 {
            assert_eq!(dw[k], 2.0 * dot * x[k]);
            assert_eq!(dx[k], 2.0 * dot * w[k]);
        }
        assert!(session.close());
    }
    assert_eq!(session.scopes_opened(), 3);
}

#[test]
fn open_close_and_indices_are_checked() {
    let mut session = Session::new(Graph::<f32>::new());
    assert!(session.with(|_| ()).is_none(), "no scope is open yet");
    assert!(!session.close());
    assert!(session.open());
    assert!(!session.open(), "a scope is open already");
    assert!(session.graph().is_none() && session.graph_mut().is_none(), "the open scope holds the graph");
    let i = session.with(|s| s.tensor(&[1.0, 2.0], &[2]).index()).unwrap();
    assert!(session.with(|s| s.var_at(i).is_some() && s.var_at(i + 1).is_none()).unwrap());
    assert!(session.with(|s| s.var_at(usize::MAX).is_none()).unwrap());
    // A poisoned handle's index is not a node of the tape.
    let bad = session.with(|s| s.var_at(i).unwrap().reshape(&[3]).index()).unwrap();
    assert!(session.with(|s| s.var_at(bad).is_none()).unwrap());
    let e = session.with(|s| s.check()).unwrap().unwrap_err();
    assert!(matches!(e, Error::InvalidShape { op: "reshape", .. }), "{e}");
    assert!(session.close());
    assert_eq!(session.graph().unwrap().stats().nodes, 1, "the closed scope's statistics");
    session.graph_mut().unwrap().set_threads(1);
}

#[test]
fn copied_parameters_route_gradients_like_borrowed_ones() {
    let mut store = ParamStore::<f64>::new();
    let w = store.add("w", Tensor::from_vec(vec![1.0, 2.0, -3.0], &[3]).unwrap()).unwrap();
    let mut by_session = store.zeros_like().unwrap();
    let mut by_scope = store.zeros_like().unwrap();
    let mut session = Session::new(Graph::<f64>::new());
    for _ in 0..2 {
        session.open();
        session
            .with(|s| {
                let wv = s.param_copied(&store, w);
                s.backward_add((wv.square() * 0.5).sum(), &mut by_session)
            })
            .unwrap()
            .unwrap();
        session.close();
        Graph::<f64>::new()
            .scope(|s| s.backward_into((s.param(&store, w).square() * 0.5).sum(), &mut by_scope))
            .unwrap();
    }
    // d/dw Σ w²/2 = w, accumulated over two steps.
    assert_eq!(by_session.get(w).unwrap().data(), [2.0, 4.0, -6.0]);
    assert_eq!(by_scope.get(w).unwrap().data(), by_session.get(w).unwrap().data());
}

#[test]
fn backward_add_checks_the_buffer_and_keeps_it_on_error() {
    let (mut ours, mut theirs) = (ParamStore::<f32>::new(), ParamStore::<f32>::new());
    let w = ours.add("w", Tensor::ones(&[2]).unwrap()).unwrap();
    let v = theirs.add("v", Tensor::ones(&[2]).unwrap()).unwrap();
    let mut wrong = theirs.zeros_like().unwrap();
    let mut session = Session::new(Graph::<f32>::new());
    session.open();
    let e = session.with(|s| s.backward_add(s.param_copied(&ours, w).sum(), &mut wrong)).unwrap().unwrap_err();
    assert!(matches!(e, Error::WrongStore { op: "backward_add", .. }), "{e}");
    assert!(e.to_string().contains("session.rs"), "located at the caller: {e}");
    assert_eq!(wrong.get(v).unwrap().data(), [0.0, 0.0], "unchanged");
}

#[test]
fn dropping_an_open_session_ends_its_scope() {
    let mut session = Session::new(Graph::<f32>::new());
    session.open();
    session.with(|s| s.variable(&[1.0; 1024], &[1024]).tanh().sum().index());
    drop(session); // closes, then frees the graph: nothing leaks (see `just asan`)
}

#[test]
fn no_grad_regions_across_calls_nest_and_end_with_the_scope() {
    let mut session = Session::new(Graph::<f64>::new());
    assert_eq!(session.enter_no_grad(), None, "no scope is open");
    assert!(session.open());
    assert_eq!(session.exit_no_grad(), None, "no region was entered");
    let x = session.with(|s| s.variable(&[2.0], &[]).index()).unwrap();
    let exp_requires_grad =
        |session: &Session<f64>| session.with(|s| s.var_at(x).unwrap().exp().requires_grad()).unwrap();
    assert_eq!(session.enter_no_grad(), Some(1));
    assert_eq!(session.enter_no_grad(), Some(2));
    assert!(!exp_requires_grad(&session));
    // A leaf made inside a region still requests its gradient, as under `Scope::no_grad`.
    assert!(session.with(|s| s.variable(&[1.0], &[]).requires_grad()).unwrap());
    assert_eq!(session.exit_no_grad(), Some(1));
    assert!(!exp_requires_grad(&session), "the outer region is still on");
    assert_eq!(session.exit_no_grad(), Some(0));
    assert!(exp_requires_grad(&session));
    // A region left open ends with its scope; the next scope records gradients again.
    assert_eq!(session.enter_no_grad(), Some(1));
    assert!(session.close());
    assert_eq!(session.exit_no_grad(), None, "closed");
    assert!(session.open());
    assert_eq!(session.exit_no_grad(), None, "the new scope has no region");
    let y = session.with(|s| s.variable(&[3.0], &[]).index()).unwrap();
    let dy = session.with(|s| {
        let yv = s.var_at(y).unwrap();
        s.backward(yv.square()).unwrap();
        yv.grad().unwrap()[0]
    });
    assert_eq!(dy, Some(6.0)); // d/dy y² = 2y
}

#[test]
fn exit_no_grad_never_ends_a_closure_region() {
    // Inside `Scope::no_grad`'s closure, a session region entered there can be exited,
    // but the closure's own region cannot: the depth never goes below the closure's.
    let mut session = Session::new(Graph::<f32>::new());
    session.open();
    let x = session.with(|s| s.variable(&[1.0], &[]).index()).unwrap();
    let frozen = session
        .with(|s| {
            s.no_grad(|| {
                assert_eq!(session.exit_no_grad(), None, "the closure's region is not the session's");
                assert_eq!(session.enter_no_grad(), Some(1));
                assert_eq!(session.exit_no_grad(), Some(0));
                s.var_at(x).unwrap().exp().requires_grad()
            })
        })
        .unwrap();
    assert!(!frozen);
    assert!(session.with(|s| s.var_at(x).unwrap().exp().requires_grad()).unwrap(), "the closure's region ended");
}

/// A two-layer step, `L = Σ tanh(x·W1)·W2`, recorded from `store` by `param`.
fn two_layer<'s, 'g>(
    s: &'s tapir::Scope<'s, 'g, f64>,
    x: &[f64],
    w1: tapir::Var<'s, f64>,
    w2: tapir::Var<'s, f64>,
) -> tapir::Var<'s, f64> {
    s.tensor(x, &[2, 3]).matmul(w1).tanh().matmul(w2).sum()
}

#[test]
fn lent_parameters_and_buffer_give_what_a_closure_scope_gives() {
    use std::sync::Arc;
    let mut store = ParamStore::<f64>::new();
    let w1 = store.add("w1", Tensor::from_vec(vec![0.3, -0.2, 0.5, 0.1, -0.4, 0.6], &[3, 2]).unwrap()).unwrap();
    let w2 = store.add("w2", Tensor::from_vec(vec![0.7, -1.1], &[2, 1]).unwrap()).unwrap();
    let x = [1.0, -2.0, 0.5, 0.25, 3.0, -1.5];
    let mut by_scope = store.zeros_like().unwrap();
    let mut by_session = Some(store.zeros_like().unwrap());
    let shared = Arc::new(store.clone());
    let mut session = Session::new(Graph::<f64>::new());
    let mut first_dw2 = None;
    for step in 0..3 {
        Graph::<f64>::new()
            .scope(|s| s.backward_into(two_layer(s, &x, s.param(&store, w1), s.param(&store, w2)), &mut by_scope))
            .unwrap();
        assert!(session.open());
        let a = session.with_param(&shared, w1, |_, v| v.index()).unwrap();
        let (b, loss) = session
            .with_param(&shared, w2, |s, v2| (v2.index(), two_layer(s, &x, s.var_at(a).unwrap(), v2).index()))
            .unwrap();
        let mut mine = Arc::clone(&shared);
        assert!(Arc::get_mut(&mut mine).is_none(), "the open scope holds the store");
        drop(mine);
        let grads = by_session.take().unwrap();
        session.backward_into(loss, grads).unwrap().unwrap();
        // The parameter's `grad` is this step's gradient (at step 0, the lent buffer's slot).
        let dw2 = session.with(|s| s.var_at(b).unwrap().grad().unwrap().to_vec()).unwrap();
        let first = first_dw2.get_or_insert_with(|| by_scope.get(w2).unwrap().data().to_vec());
        assert_eq!(&dw2, first, "step {step}");
        assert!(session.take_grads().is_none(), "lent while the scope is open");
        assert!(session.close());
        by_session = session.take_grads();
        assert!(session.take_grads().is_none(), "handed back once");
        for id in [w1, w2] {
            let (a, b) = (by_scope.get(id).unwrap(), by_session.as_ref().unwrap().get(id).unwrap());
            assert_eq!(a.data(), b.data(), "step {step}: the same gradients, bit for bit");
        }
    }
    // Closed-form check of one entry: ∂L/∂W2[0] = Σ_rows tanh(x·W1)[row, 0], three steps.
    let h0: f64 = (0..2).map(|r| (0..3).map(|k| x[r * 3 + k] * [0.3, 0.5, -0.4][k]).sum::<f64>().tanh()).sum();
    let got = by_session.as_ref().unwrap().get(w2).unwrap().data()[0];
    assert!((got - 3.0 * h0).abs() < 1e-12, "{got} vs {}", 3.0 * h0);
    let mut free = shared;
    assert!(Arc::get_mut(&mut free).is_some(), "closing the scope let the store go");
}

#[test]
fn a_buffer_is_refused_unless_a_scope_can_take_it() {
    use std::sync::Arc;
    let mut store = ParamStore::<f32>::new();
    let w = store.add("w", Tensor::ones(&[2]).unwrap()).unwrap();
    let other = ParamStore::<f32>::new().zeros_like().unwrap();
    let store = Arc::new(store);
    let mut session = Session::new(Graph::<f32>::new());
    let refused = session.backward_into(0, store.zeros_like().unwrap()).unwrap_err(); // no scope is open
    assert!(refused.error.is_none());
    session.open();
    let (wi, loss) = session.with_param(&store, w, |_, v| (v.index(), v.sum().index())).unwrap();
    let refused = session.backward_into(loss + 1, refused.grads).unwrap_err(); // not a node
    assert!(refused.error.is_none());
    // The checks the pass runs first: a buffer of another store, a non-scalar loss.
    let e = session.backward_into(loss, other).unwrap_err().error.unwrap();
    assert!(matches!(e, Error::WrongStore { op: "backward_into", .. }), "{e}");
    assert!(e.to_string().contains("session.rs"), "located at the caller: {e}");
    let refused = session.backward_into(wi, refused.grads).unwrap_err();
    assert!(refused.error.is_some(), "a non-scalar loss");
    assert!(session.take_grads().is_none(), "nothing was lent");
    // Lent once; a second buffer in the same scope is refused.
    session.backward_into(loss, store.zeros_like().unwrap()).unwrap().unwrap();
    let grads = session.backward_into(loss, refused.grads).unwrap_err().grads;
    session.close();
    assert_eq!(session.take_grads().unwrap().get(w).unwrap().data(), [1.0, 1.0]);
    assert_eq!(grads.get(w).unwrap().data(), [0.0, 0.0], "untouched");
    // The refused buffer works in the next scope.
    session.open();
    let loss = session.with_param(&store, w, |_, v| (v * 3.0).sum().index()).unwrap();
    session.backward_into(loss, grads).unwrap().unwrap();
    drop(session); // still lent: freed with the session (see `just asan`)
}
