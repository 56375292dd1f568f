//! Fuzzes the safetensors reader on whole files: any bytes are refused with a typed
//! error or accepted, never a panic; an accepted header written back canonically
//! parses to the same tensors and metadata, and the canonical form is a fixed point.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tlio_core::safetensors::header::Header;
use tlio_core::safetensors::write::TensorSpec;
use tlio_core::safetensors::{canonical_header, parse_header};

/// The canonical file (header plus zeroed data) holding `h`'s tensors and metadata.
fn canonical_file(h: &Header) -> Vec<u8> {
    let specs: Vec<TensorSpec<'_>> = h
        .tensors()
        .iter()
        .map(|t| TensorSpec::from_info(t, t.dtype))
        .collect();
    let layout = canonical_header(&specs, &h.metadata)
        .unwrap_or_else(|e| panic!("an accepted header must be writable: {e}"));
    let mut file = layout.header.clone();
    let data_len = usize::try_from(layout.data_len).expect("data fits memory");
    file.resize(file.len() + data_len, 0);
    file
}

/// Name, dtype and shape of every tensor, sorted by name (offsets may move).
fn shapes(h: &Header) -> Vec<(String, String, Vec<u64>)> {
    let mut v: Vec<_> = h
        .tensors()
        .iter()
        .map(|t| (t.name.clone(), t.dtype.name().to_string(), t.shape.clone()))
        .collect();
    v.sort();
    v
}

fuzz_target!(|data: &[u8]| {
    let Ok(h) = parse_header(data) else { return };
    let file = canonical_file(&h);
    let back = parse_header(&file)
        .unwrap_or_else(|e| panic!("canonical bytes of an accepted header refused: {e}"));
    assert_eq!(shapes(&h), shapes(&back));
    assert_eq!(h.metadata, back.metadata);
    assert_eq!(
        canonical_file(&back),
        file,
        "canonical form is not a fixed point"
    );
});
