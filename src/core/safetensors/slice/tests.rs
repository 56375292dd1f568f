//! The read plan against a reference that indexes element by element.

use super::*;
use proptest::prelude::*;

/// The bytes of `shape`'s tensor (element `k` holds bytes `k*elem..` of a counter) at
/// `indices`, computed element by element: (output shape, bytes).
fn reference(shape: &[u64], elem: usize, idx: &[Index]) -> Result<(Vec<u64>, Vec<u8>), SliceError> {
    let full = expand(idx, shape.len())?;
    let mut per_dim = Vec::new();
    let mut out_shape = Vec::new();
    for (d, (i, n)) in full.iter().zip(shape).enumerate() {
        let (start, count, step, kept) = take(*i, d, *n)?;
        per_dim.push((0..count).map(|j| start + j * step).collect::<Vec<u64>>());
        if kept {
            out_shape.push(count);
        }
    }
    let mut out = Vec::new();
    let mut combos: Vec<Vec<u64>> = vec![vec![]];
    for positions in &per_dim {
        combos = combos
            .iter()
            .flat_map(|c| {
                positions
                    .iter()
                    .map(move |p| [c.clone(), vec![*p]].concat())
            })
            .collect();
    }
    for c in combos {
        let mut flat = 0u64;
        for (p, n) in c.iter().zip(shape) {
            flat = flat * n + p;
        }
        for b in 0..elem {
            out.push(((flat as usize * elem + b) % 251) as u8);
        }
    }
    Ok((out_shape, out))
}

fn stored(shape: &[u64], elem: usize) -> Vec<u8> {
    let n: u64 = shape.iter().product();
    (0..n as usize * elem).map(|k| (k % 251) as u8).collect()
}

fn index() -> impl Strategy<Value = Index> {
    prop_oneof![
        (-7i64..7).prop_map(Index::At),
        (
            proptest::option::of(-7i64..7),
            proptest::option::of(-7i64..7),
            proptest::option::of(1i64..4)
        )
            .prop_map(|(start, stop, step)| Index::Range { start, stop, step }),
        Just(Index::Ellipsis),
    ]
}

proptest! {
    /// Every plan gathers exactly the bytes element-by-element indexing gives, with
    /// the same shape, or both refuse.
    #[test]
    fn plan_matches_elementwise_indexing(
        shape in proptest::collection::vec(0u64..6, 0..4),
        idx in proptest::collection::vec(index(), 0..4),
        dtype in prop_oneof![Just(Dtype::U8), Just(Dtype::BF16), Just(Dtype::F32), Just(Dtype::F64)],
    ) {
        let elem = dtype.size().unwrap_or(1);
        let src = stored(&shape, elem);
        let want = reference(&shape, elem, &idx);
        let got = SlicePlan::new(dtype, &shape, &idx).and_then(|p| Ok((p.shape.clone(), p.gather(&src)?)));
        prop_assert_eq!(got, want);
    }
}

#[test]
fn the_packages_messages_and_shapes() {
    let a = [10u64, 5];
    let r = |start, stop| Index::Range {
        start,
        stop,
        step: None,
    };
    let plan = |idx: &[Index]| SlicePlan::new(Dtype::F32, &a, idx);
    assert_eq!(
        plan(&[r(Some(2), None), Index::At(-6)])
            .unwrap_err()
            .to_string(),
        "Invalid index -6 for dimension 1 of size 5"
    );
    assert_eq!(
        plan(&[r(Some(2), None), Index::At(20)])
            .unwrap_err()
            .to_string(),
        "index 20 out of bounds for tensor dimension #1 of size 5"
    );
    assert_eq!(
        plan(&[r(None, Some(20))]).unwrap_err().to_string(),
        "index 19 out of bounds for tensor dimension #0 of size 10"
    );
    assert_eq!(
        plan(&[r(Some(2), None), Index::At(-1)]).unwrap().shape,
        vec![8]
    );
    assert_eq!(plan(&[r(Some(0), Some(0))]).unwrap().shape, vec![0, 5]);
    assert!(matches!(
        SlicePlan::new(Dtype::F4, &[4], &[]),
        Err(SliceError::SubByte { .. })
    ));
    assert!(matches!(
        plan(&[Index::Ellipsis, Index::Ellipsis]),
        Err(SliceError::TwoEllipses)
    ));
    assert!(matches!(
        plan(&[Index::At(0), Index::At(0), Index::At(0)]),
        Err(SliceError::TooMany { .. })
    ));
}

#[test]
fn one_row_is_one_run_and_a_column_one_run_per_row() {
    let mut runs = Vec::new();
    let p = SlicePlan::new(Dtype::F32, &[100, 50], &[Index::At(7)]).unwrap();
    p.for_each_run(|o, l| runs.push((o, l)));
    assert_eq!(runs, vec![(7 * 200, 200)]);
    runs.clear();
    let p = SlicePlan::new(Dtype::F32, &[100, 50], &[Index::Ellipsis, Index::At(3)]).unwrap();
    p.for_each_run(|o, l| runs.push((o, l)));
    assert_eq!(runs.len(), 100);
    assert_eq!(runs.first(), Some(&(12, 4)));
    assert_eq!(p.byte_len(), 400);
}
