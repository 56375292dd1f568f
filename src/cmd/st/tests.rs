//! Unit tests of `tlio st`'s rendering: the streamed JSON documents and table keep the
//! bytes the unstreamed forms gave.

/// A small file with a name needing JSON escapes, a non-ASCII name, metadata and a
/// zero-size tensor; written by the canonical writer into `dir`.
fn sample(dir: &std::path::Path, name: &str, scale: f32) -> std::path::PathBuf {
    use tlio_core::safetensors::{save, Dtype, Tensor, TensorData};
    let path = dir.join(name);
    let w = [1.0f32, -2.5, scale, 4.0];
    let tensors = [
        Tensor {
            name: "w\"q\u{1b}".to_string(),
            dtype: Dtype::F32,
            shape: vec![2, 2],
            data: TensorData::F32(&w),
        },
        Tensor {
            name: "café".to_string(),
            dtype: Dtype::BF16,
            shape: vec![0, 3],
            data: TensorData::F32(&[]),
        },
    ];
    let meta = [("format".to_string(), "pt".to_string())].into();
    save(&path, &tensors, &meta).unwrap();
    path
}

/// The streamed documents must have the bytes a `serde_json::Value` (sorted keys)
/// of the same document has: that is how they were printed before streaming.
fn assert_sorted_like_a_value<T: serde::Serialize>(doc: &T) {
    let streamed = serde_json::to_string(doc).unwrap();
    let value = serde_json::to_value(doc).unwrap();
    assert_eq!(streamed, serde_json::to_string(&value).unwrap());
}

#[test]
fn streamed_inspect_json_is_the_sorted_document() {
    let dir = tempfile::tempdir().unwrap();
    let path = sample(dir.path(), "a.safetensors", 3.0);
    let bar = indicatif::ProgressBar::hidden();
    for stats in [false, true] {
        let file = super::inspect::inspect_one(&path, stats, &bar).unwrap();
        let doc = super::inspect::JsonDoc {
            files: vec![super::inspect::json_file(&file).unwrap()],
        };
        assert_sorted_like_a_value(&doc);
    }
}

#[test]
fn streamed_diff_json_is_the_sorted_document() {
    use tlio_core::model::view::{diff_views, ModelView};
    let dir = tempfile::tempdir().unwrap();
    let a = ModelView::open(&sample(dir.path(), "a.safetensors", 3.0)).unwrap();
    let b = ModelView::open(&sample(dir.path(), "b.safetensors", 5.0)).unwrap();
    let report = diff_views(&a, &b);
    assert_eq!(report.different.len(), 1);
    assert_eq!(report.equal.len(), 1);
    assert_sorted_like_a_value(&super::diff::DiffJson {
        changed: &report.changed,
        different: &report.different,
        equal: &report.equal,
        identical: report.identical(),
        metadata: &report.metadata,
        only_in_a: &report.only_in_a,
        only_in_b: &report.only_in_b,
    });
}

#[test]
fn the_streamed_table_is_the_piped_table() {
    let dir = tempfile::tempdir().unwrap();
    let path = sample(dir.path(), "a.safetensors", 3.0);
    let bar = indicatif::ProgressBar::hidden();
    let file = super::inspect::inspect_one(&path, true, &bar).unwrap();
    let listing = tlio_core::model::view::Listing::new(&file.model);
    let printer =
        crate::output::Printer::with_writers(false, false, false, std::io::sink(), std::io::sink());
    let mut streamed = Vec::new();
    super::inspect::print_tensor_table(&file, &listing, true, &printer, &mut streamed).unwrap();
    // What comfy-table made of the same rows before the table was streamed.
    let mut table = printer.table();
    table.set_header(vec![
        "name", "dtype", "shape", "params", "bytes", "offsets", "min", "max", "mean", "std", "nan",
        "inf",
    ]);
    for r in listing.rows() {
        table.add_row(super::inspect::tensor_cells(&r, false, file.stats_of(&r)));
    }
    let expected = format!("{}\n", crate::output::table_text(&table));
    assert_eq!(String::from_utf8(streamed).unwrap(), expected);
    // File order (the writer puts the zero-size tensor last), names escaped.
    let lines: Vec<&str> = expected.lines().collect();
    assert!(lines[1].starts_with(" w\"q\\u{1b}  F32"), "{expected}");
    assert!(lines[2].starts_with(" café       BF16"), "{expected}");
}
