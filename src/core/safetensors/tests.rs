//! The seed's safetensors tests (section 4) under their own names, plus the writer
//! oracle (the reference crate's `serialize`) and codec properties.

use std::borrow::Cow;
use std::collections::BTreeMap;

use proptest::prelude::*;
use proptest::strategy::ValueTree;

use super::float::*;
use super::*;

fn meta(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn to_vec(tensors: &[Tensor<'_>], metadata: &BTreeMap<String, String>) -> Vec<u8> {
    let mut out = Vec::new();
    let n = write(&mut out, tensors, metadata).unwrap();
    assert_eq!(n, out.len() as u64);
    out
}

fn raw<'a>(name: &str, dtype: Dtype, shape: &[u64], bytes: &'a [u8]) -> Tensor<'a> {
    Tensor {
        name: name.to_string(),
        dtype,
        shape: shape.to_vec(),
        data: TensorData::Raw(Cow::Borrowed(bytes)),
    }
}

fn f32s<'a>(name: &str, dtype: Dtype, shape: &[u64], v: &'a [f32]) -> Tensor<'a> {
    Tensor {
        name: name.to_string(),
        dtype,
        shape: shape.to_vec(),
        data: TensorData::F32(v),
    }
}

fn roundtrip_file(bytes: &[u8]) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.safetensors");
    std::fs::write(&path, bytes).unwrap();
    (dir, path)
}

#[test]
fn test_worked_example_bf16_bytes() {
    let values = [1.0f32, 2.0, 3.0, 4.0];
    let file = to_vec(
        &[f32s("w", Dtype::BF16, &[2, 2], &values)],
        &meta(&[("format", "tinyllm")]),
    );
    let header = br#"{"__metadata__":{"format":"tinyllm"},"w":{"dtype":"BF16","shape":[2,2],"data_offsets":[0,8]}}"#;
    assert_eq!(header.len(), 93);
    let mut expected = vec![0x60, 0, 0, 0, 0, 0, 0, 0];
    expected.extend_from_slice(header);
    expected.extend_from_slice(b"   ");
    expected.extend_from_slice(&[0x80, 0x3f, 0x00, 0x40, 0x40, 0x40, 0x80, 0x40]);
    assert_eq!(expected.len(), 112);
    assert_eq!(file, expected);
    let (_d, path) = roundtrip_file(&file);
    let m = MappedFile::open(&path).unwrap();
    assert_eq!(m.decode_f32("w").unwrap(), values);
    assert_eq!(m.header().get("w").unwrap().dtype, Dtype::BF16);
}

#[test]
fn test_v0_calls_still_work() {
    // The format page's F32 worked example: 120 bytes, read back to the same values.
    let values = [1.0f32, 2.0, 3.0, 4.0];
    let file = to_vec(
        &[f32s("w", Dtype::F32, &[2, 2], &values)],
        &meta(&[("format", "tinyllm")]),
    );
    let header = br#"{"__metadata__":{"format":"tinyllm"},"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}}"#;
    assert_eq!(file.len(), 120);
    assert_eq!(&file[..8], &96u64.to_le_bytes());
    assert_eq!(&file[8..101], &header[..]);
    assert_eq!(&file[101..104], b"   ");
    assert_eq!(
        &file[104..],
        &[0, 0, 0x80, 0x3f, 0, 0, 0, 0x40, 0, 0, 0x40, 0x40, 0, 0, 0x80, 0x40]
    );
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v0.safetensors");
    save(
        &path,
        &[f32s("w", Dtype::F32, &[2, 2], &values)],
        &meta(&[("format", "tinyllm")]),
    )
    .unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), file);
    let h = read_header(&path).unwrap();
    assert_eq!(h.metadata, meta(&[("format", "tinyllm")]));
    assert_eq!(h.tensors().len(), 1);
    assert_eq!(h.header_len, 96);
    assert_eq!(h.data_start(), 104);
    let m = MappedFile::open(&path).unwrap();
    assert_eq!(m.decode_f32("w").unwrap(), values);
    assert_eq!(m.decode_f64("w").unwrap(), [1.0, 2.0, 3.0, 4.0]);
    assert_eq!(m.tensor_bytes("w").unwrap(), &file[104..]);
    assert!(m.tensor_bytes("nope").is_none());
}

#[test]
fn test_raw_bits_are_written_as_is() {
    // BF16 bits including a signalling-NaN payload and a subnormal; F8 codes including
    // both NaNs and negative zero: all land on disk untouched and come back as bytes.
    let bf16_bits: Vec<u8> = [0x7F81u16, 0x0001, 0xFFFF, 0x3F80, 0x8000]
        .iter()
        .flat_map(|b| b.to_le_bytes())
        .collect();
    let f8: Vec<u8> = vec![0x7F, 0xFF, 0x80, 0x01, 0x7E, 0x38];
    let file = to_vec(
        &[
            raw("b", Dtype::BF16, &[5], &bf16_bits),
            raw("q", Dtype::F8_E4M3, &[6], &f8),
        ],
        &BTreeMap::new(),
    );
    let h = parse_header(&file).unwrap();
    let start = h.data_start() as usize;
    let b = h.get("b").unwrap();
    let q = h.get("q").unwrap();
    assert_eq!(
        &file[start + b.data_offsets.0 as usize..start + b.data_offsets.1 as usize],
        &bf16_bits[..]
    );
    assert_eq!(
        &file[start + q.data_offsets.0 as usize..start + q.data_offsets.1 as usize],
        &f8[..]
    );
}

#[test]
fn test_bf16_rounds_to_nearest_even() {
    let cases: [(u32, u16); 6] = [
        (0x3F80_8000, 0x3F80), // 1 + 2^-8: tie, to even 0x3F80
        (0x3F81_8000, 0x3F82), // tie above an odd code: up to even
        (0x3F80_7FFF, 0x3F80), // below half
        (0x3F80_8001, 0x3F81), // above half
        (0xBF80_8000, 0xBF80), // negative tie
        (0x7F7F_FFFF, 0x7F80), // rounds past the largest finite: infinity
    ];
    for (x, want) in cases {
        assert_eq!(f32_to_bf16(f32::from_bits(x)), want, "{x:#x}");
        assert_eq!(f64_to_bf16(f64::from(f32::from_bits(x))), want, "{x:#x}");
    }
    // One rounding from f64: a hair above the tie goes up. Rounding through f32 first
    // (or truncating the f64 as the half crate does) would land on the tie and go down.
    let above_tie = 1.0 + 2f64.powi(-8) + 2f64.powi(-40);
    assert_eq!(f64_to_bf16(above_tie), 0x3F81);
    assert_eq!(f32_to_bf16(above_tie as f32), 0x3F80);
    assert_eq!(f32_to_bf16(f32::NAN), 0x7FC0);
    assert_eq!(f32_to_bf16(-f32::NAN), 0xFFC0);
    assert_eq!(f64_to_bf16(-f64::NAN), 0xFFC0);
    // Through the writer.
    let v = [f32::from_bits(0x3F80_8000), f32::from_bits(0x3F81_8000)];
    let file = to_vec(&[f32s("x", Dtype::BF16, &[2], &v)], &BTreeMap::new());
    assert_eq!(&file[file.len() - 4..], &[0x80, 0x3F, 0x82, 0x3F]);
}

#[test]
fn test_f8_e4m3_codes() {
    let cases: [(f64, u8); 8] = [
        (0.0, 0x00),
        (2f64.powi(-9), 0x01),
        (2f64.powi(-6), 0x08),
        (1.0, 0x38),
        (448.0, 0x7E),
        (-0.0, 0x80),
        (-448.0, 0xFE),
        (256.0, 0x78),
    ];
    for (v, code) in cases {
        assert_eq!(f64_to_e4m3(v), Some(code), "{v}");
        let back = e4m3_to_f32(code);
        assert_eq!(back.to_bits(), (v as f32).to_bits(), "{code:#x}");
    }
    assert_eq!(f64_to_e4m3(f64::NAN), Some(0x7F));
    assert!(e4m3_to_f32(0x7F).is_nan());
    assert!(e4m3_to_f32(0xFF).is_nan());
    // Exponent 15 is numbers, not infinity/NaN; subnormals are m/8 * 2^-6.
    assert_eq!(e4m3_to_f32(0x78), 256.0);
    assert_eq!(e4m3_to_f32(0x7D), 416.0);
    assert_eq!(e4m3_to_f32(0x07), 7.0 / 8.0 * 2f32.powi(-6));
    assert_eq!(e4m3_to_f32(0x08), 2f32.powi(-6));
}

#[test]
fn test_f8_rounds_to_nearest_even() {
    let cases: [(f64, u8); 9] = [
        (1.0625, 0x38),               // halfway 1 and 1.125: even 0x38
        (1.1875, 0x3A),               // halfway 1.125 (0x39) and 1.25 (0x3A): even
        (250.0, 0x78),                // above the 248 midpoint
        (248.0, 0x78),                // the midpoint 240 (0x77) / 256 (0x78): even 0x78
        (2f64.powi(-10), 0x00),       // subnormal tie between 0 and 2^-9: to zero
        (3.0 * 2f64.powi(-10), 0x02), // subnormal tie 0x01 / 0x02: even
        (-0.0, 0x80),
        (-(2f64.powi(-11)), 0x80),     // rounds to negative zero
        (15.0 * 2f64.powi(-10), 0x08), // tie 0x07 / 0x08 crosses into the normals
    ];
    for (v, code) in cases {
        assert_eq!(f64_to_e4m3(v), Some(code), "{v}");
        let mut out = Vec::new();
        encode_f32(Dtype::F8_E4M3, &[v as f32], &mut out).unwrap();
        assert_eq!(out, [code], "{v} through f32");
    }
}

#[test]
fn test_f8_rejects_out_of_range() {
    for bad in [
        449.0f32,
        448.5,
        464.0,
        1e6,
        f32::INFINITY,
        -449.0,
        f32::NEG_INFINITY,
    ] {
        let values = [1.0f32, 2.0, bad];
        let err = write(
            Vec::new(),
            &[f32s("scale.me", Dtype::F8_E4M3, &[3], &values)],
            &BTreeMap::new(),
        )
        .unwrap_err();
        match &err {
            SafetensorsError::OutOfRange { tensor, index, .. } => {
                assert_eq!(tensor, "scale.me");
                assert_eq!(*index, 2);
            }
            other => panic!("{bad}: {other}"),
        }
        assert!(err.to_string().contains("scale.me"));
    }
    // NaN is not out of range: it is 0x7F; 448 is the largest code.
    let file = to_vec(
        &[f32s("n", Dtype::F8_E4M3, &[2], &[f32::NAN, 448.0])],
        &BTreeMap::new(),
    );
    assert_eq!(&file[file.len() - 2..], &[0x7F, 0x7E]);
    // The save is atomic: nothing is left behind on an error.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("x.safetensors");
    assert!(save(
        &path,
        &[f32s("n", Dtype::F8_E4M3, &[1], &[500.0])],
        &BTreeMap::new()
    )
    .is_err());
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

#[test]
fn test_dtype_order_then_name() {
    let a = [1.0f32];
    let b = [2.0f32];
    let c = [3.0f32];
    let file = to_vec(
        &[
            f32s("a_u8", Dtype::U8, &[1], &c),
            f32s("b_i32", Dtype::I32, &[1], &b),
            f32s("z_f32", Dtype::F32, &[1], &a),
            f32s("y_f32", Dtype::F32, &[1], &a),
        ],
        &BTreeMap::new(),
    );
    let h = parse_header(&file).unwrap();
    let names: Vec<_> = h.tensors().iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["y_f32", "z_f32", "b_i32", "a_u8"]);
    assert_eq!(h.get("y_f32").unwrap().data_offsets, (0, 4));
    assert_eq!(h.get("z_f32").unwrap().data_offsets, (4, 8));
    assert_eq!(h.get("b_i32").unwrap().data_offsets, (8, 12));
    assert_eq!(h.get("a_u8").unwrap().data_offsets, (12, 13));
    // The header lists them in the same order.
    let text = std::str::from_utf8(&file[8..8 + h.header_len as usize]).unwrap();
    let pos = |n: &str| text.find(n).unwrap();
    assert!(
        pos("y_f32") < pos("z_f32") && pos("z_f32") < pos("b_i32") && pos("b_i32") < pos("a_u8")
    );
}

#[test]
fn test_save_rejects_bad_dtypes() {
    // Unknown or mis-cased names never become a dtype.
    for name in ["bf16", "float64", "F64 ", "FLOAT", "f32", "int8"] {
        assert_eq!(Dtype::from_name(name), None, "{name:?}");
    }
    let empty = BTreeMap::new();
    // float64 bytes labelled F32: the byte count gives them away.
    let f64_bytes: Vec<u8> = [1.0f64, 2.0].iter().flat_map(|v| v.to_le_bytes()).collect();
    let err = write(
        Vec::new(),
        &[raw("x", Dtype::F32, &[2], &f64_bytes)],
        &empty,
    )
    .unwrap_err();
    assert!(matches!(err, SafetensorsError::DataLength { .. }), "{err}");
    // Float values into an integer dtype only when exact.
    let err = write(
        Vec::new(),
        &[f32s("i", Dtype::I32, &[2], &[1.0, 1.5])],
        &empty,
    )
    .unwrap_err();
    assert!(
        matches!(err, SafetensorsError::NotExact { index: 1, .. }),
        "{err}"
    );
    let err = write(Vec::new(), &[f32s("i", Dtype::I8, &[1], &[128.0])], &empty).unwrap_err();
    assert!(matches!(err, SafetensorsError::NotExact { .. }), "{err}");
    let err = write(Vec::new(), &[f32s("b", Dtype::BOOL, &[1], &[2.0])], &empty).unwrap_err();
    assert!(matches!(err, SafetensorsError::NotExact { .. }), "{err}");
    // Raw-only dtypes take no numbers.
    for d in [Dtype::C64, Dtype::F8_E8M0, Dtype::F8_E4M3FNUZ, Dtype::F4] {
        let err = write(Vec::new(), &[f32s("r", d, &[2], &[1.0, 2.0])], &empty).unwrap_err();
        assert!(
            matches!(err, SafetensorsError::RawOnly { .. }),
            "{d}: {err}"
        );
    }
    // Values count must match the shape.
    let err = write(
        Vec::new(),
        &[f32s("s", Dtype::F32, &[3], &[1.0, 2.0])],
        &empty,
    )
    .unwrap_err();
    assert!(matches!(err, SafetensorsError::DataLength { .. }), "{err}");
    // The reserved name and duplicate names.
    let err = write(
        Vec::new(),
        &[f32s("__metadata__", Dtype::F32, &[1], &[1.0])],
        &empty,
    )
    .unwrap_err();
    assert!(matches!(err, SafetensorsError::ReservedName), "{err}");
    let err = write(
        Vec::new(),
        &[
            f32s("d", Dtype::F32, &[1], &[1.0]),
            f32s("d", Dtype::F16, &[1], &[1.0]),
        ],
        &empty,
    )
    .unwrap_err();
    assert!(
        matches!(err, SafetensorsError::DuplicateTensor { .. }),
        "{err}"
    );
    // A sub-byte count that is not whole bytes.
    let err = write(Vec::new(), &[raw("p", Dtype::F4, &[3], &[0, 0])], &empty).unwrap_err();
    assert!(matches!(err, SafetensorsError::SubByte { .. }), "{err}");
}

#[test]
fn test_read_header_checks_without_reading() {
    let dir = tempfile::tempdir().unwrap();
    let ok = dir.path().join("ok.safetensors");
    let v = [1.0f32; 6];
    save(
        &ok,
        &[
            f32s("a", Dtype::BF16, &[2, 3], &v),
            f32s("s", Dtype::F32, &[], &v[..1]),
        ],
        &BTreeMap::new(),
    )
    .unwrap();
    let h = read_header(&ok).unwrap();
    assert_eq!(h.get("a").unwrap().dtype, Dtype::BF16);
    assert_eq!(h.get("a").unwrap().shape, [2, 3]);
    assert_eq!(h.get("s").unwrap().shape, Vec::<u64>::new());

    // Trailing bytes after the last tensor break rule 5.
    let mut bytes = std::fs::read(&ok).unwrap();
    bytes.push(0);
    let trailing = dir.path().join("trailing.safetensors");
    std::fs::write(&trailing, &bytes).unwrap();
    assert!(matches!(
        read_header(&trailing).unwrap_err(),
        SafetensorsError::Tiling { .. }
    ));
    // A huge header length is refused before any allocation.
    let huge = dir.path().join("huge.safetensors");
    let mut b = u64::MAX.to_le_bytes().to_vec();
    b.extend_from_slice(b"{}");
    std::fs::write(&huge, &b).unwrap();
    assert!(matches!(
        read_header(&huge).unwrap_err(),
        SafetensorsError::HeaderTooLarge { .. }
    ));
    let past = dir.path().join("past.safetensors");
    let mut b = 1000u64.to_le_bytes().to_vec();
    b.extend_from_slice(b"{}      ");
    std::fs::write(&past, &b).unwrap();
    assert!(matches!(
        read_header(&past).unwrap_err(),
        SafetensorsError::HeaderPastEnd { .. }
    ));
    // A sparse file whose header claims 20 GB: only the header is read.
    let big = dir.path().join("big.safetensors");
    let n: u64 = 20_000_000_000 / 4;
    let specs = [write::TensorSpec {
        name: "big",
        dtype: Dtype::F32,
        shape: &[n],
    }];
    let layout = canonical_header(&specs, &BTreeMap::new()).unwrap();
    std::fs::write(&big, &layout.header).unwrap();
    let f = std::fs::OpenOptions::new().write(true).open(&big).unwrap();
    f.set_len(layout.file_size()).unwrap();
    let h = read_header(&big).unwrap();
    assert_eq!(h.get("big").unwrap().byte_len(), 20_000_000_000);
}

#[test]
fn test_load_rejects_unknown_dtypes() {
    let file = |dtype: &str, shape: &str, end: u64| {
        let json =
            format!(r#"{{"t":{{"dtype":"{dtype}","shape":{shape},"data_offsets":[0,{end}]}}}}"#);
        let mut b = (json.len() as u64).to_le_bytes().to_vec();
        b.extend_from_slice(json.as_bytes());
        b.extend(std::iter::repeat_n(0u8, end as usize));
        b
    };
    for bad in ["bf16", "F64 ", "FLOAT", "f32", "Bool"] {
        let err = parse_header(&file(bad, "[2]", 4)).unwrap_err();
        assert!(
            matches!(err, SafetensorsError::UnknownDtype { .. }),
            "{bad}: {err}"
        );
        assert!(err.to_string().contains("rule 4"));
    }
    // F64 and BOOL are known dtypes here (every dtype of the library is).
    assert!(parse_header(&file("F64", "[2]", 16)).is_ok());
    assert!(parse_header(&file("BOOL", "[2]", 2)).is_ok());
    // A wrong byte count.
    let err = parse_header(&file("F32", "[2]", 12)).unwrap_err();
    assert!(matches!(err, SafetensorsError::ByteCount { .. }), "{err}");
}

#[test]
fn test_raw_codes_roundtrip() {
    // Every code of every 8- and 16-bit float dtype with an encoder: raw bits -> values
    // -> bits gives the same file, except that NaN codes come back as the canonical NaN
    // of their sign (the spec's encoder rule).
    let cases: [(Dtype, u16); 3] = [
        (Dtype::BF16, 0x7FC0),
        (Dtype::F16, 0x7E00),
        (Dtype::F8_E4M3, 0x7F),
    ];
    for (dtype, qnan) in cases.into_iter().chain([(Dtype::F8_E5M2, 0x7E)]) {
        let wide = dtype.bits() == 16;
        let codes: Vec<u16> = if wide {
            (0..=u16::MAX).collect()
        } else {
            (0..=255).collect()
        };
        let bytes: Vec<u8> = if wide {
            codes.iter().flat_map(|c| c.to_le_bytes()).collect()
        } else {
            codes.iter().map(|&c| c as u8).collect()
        };
        let n = codes.len() as u64;
        let file = to_vec(&[raw("t", dtype, &[n], &bytes)], &BTreeMap::new());
        let (_d, path) = roundtrip_file(&file);
        let m = MappedFile::open(&path).unwrap();
        let values = m.decode_f32("t").unwrap();
        let values64 = m.decode_f64("t").unwrap();
        let again = to_vec(&[f32s("t", dtype, &[n], &values)], &BTreeMap::new());
        let again64 = to_vec(
            &[Tensor {
                name: "t".into(),
                dtype,
                shape: vec![n],
                data: TensorData::F64(&values64),
            }],
            &BTreeMap::new(),
        );
        assert_eq!(again, again64, "{dtype}: f32 and f64 paths agree");
        let start = file.len() - bytes.len();
        let sign_bit: u16 = if wide { 0x8000 } else { 0x80 };
        for (i, &code) in codes.iter().enumerate() {
            let got = if wide {
                u16::from_le_bytes([again[start + 2 * i], again[start + 2 * i + 1]])
            } else {
                u16::from(again[start + i])
            };
            let want = if values[i].is_nan() {
                (code & sign_bit) | qnan
            } else {
                code
            };
            assert_eq!(got, want, "{dtype} code {code:#x}");
        }
    }
}

/// The generic RNE encoder of this module, applied to f32 inputs, agrees with the
/// `half` crate's f32 conversions on a dense sample of all f32 bit patterns.
#[test]
fn half_crate_f32_paths_agree_with_generic_rounding() {
    let mut x: u32 = 0;
    loop {
        let v = f32::from_bits(x);
        if !v.is_nan() {
            assert_eq!(f32_to_bf16(v), f64_to_bf16(f64::from(v)), "{x:#x}");
            assert_eq!(f32_to_f16(v), f64_to_f16(f64::from(v)), "{x:#x}");
        }
        match x.checked_add(4093) {
            Some(n) => x = n,
            None => break,
        }
    }
}

#[test]
fn e5m2_and_fnuz_and_e8m0_decoding() {
    assert_eq!(e5m2_to_f32(0x3C), 1.0);
    assert_eq!(e5m2_to_f32(0x7B), 57344.0);
    assert_eq!(e5m2_to_f32(0x7C), f32::INFINITY);
    assert!(e5m2_to_f32(0x7D).is_nan());
    assert_eq!(e5m2_to_f32(0x01), 2f32.powi(-16));
    assert_eq!(
        f64_to_e5m2(61440.0),
        0x7C,
        "the tie above the max goes to infinity"
    );
    assert_eq!(f64_to_e5m2(61439.0), 0x7B);
    assert_eq!(f64_to_e5m2(1e9), 0x7C);
    assert_eq!(f64_to_e5m2(-f64::INFINITY), 0xFC);
    assert_eq!(e4m3fnuz_to_f32(0x40), 1.0);
    assert!(e4m3fnuz_to_f32(0x80).is_nan());
    assert_eq!(e4m3fnuz_to_f32(0x7F), 240.0);
    assert_eq!(e5m2fnuz_to_f32(0x40), 1.0);
    assert_eq!(e5m2fnuz_to_f32(0x7F), 57344.0);
    assert_eq!(e8m0_to_f32(127), 1.0);
    assert_eq!(e8m0_to_f32(0), 2f32.powi(-127));
    assert_eq!(e8m0_to_f32(254), 2f32.powi(127));
    assert!(e8m0_to_f32(255).is_nan());
    assert_eq!(f64_to_f16(65520.0), 0x7C00);
    assert_eq!(f64_to_f16(65519.99), 0x7BFF);
    assert_eq!(f64_to_f16(2f64.powi(-25)), 0x0000);
    assert_eq!(f64_to_f16(2f64.powi(-25) * 1.0000001), 0x0001);
}

fn lib_dtype(d: Dtype) -> safetensors::Dtype {
    serde_json::from_str(&format!("\"{}\"", d.name())).unwrap()
}

#[derive(Debug, Clone)]
struct Gen {
    name: String,
    dtype: Dtype,
    shape: Vec<u64>,
    bytes: Vec<u8>,
}

fn arb_tensor() -> impl Strategy<Value = Gen> {
    let names = prop_oneof![
        "[a-z]{1,6}(\\.[a-z0-9_]{1,4}){0,2}",
        "[\\u{0}-\\u{7f}]{1,4}",
        "[α-ω😀é\"\\\\]{1,3}",
    ];
    (
        names,
        0usize..Dtype::ALL.len(),
        prop::collection::vec(0u64..4, 0..3),
    )
        .prop_flat_map(|(name, d, mut shape)| {
            let dtype = Dtype::ALL[d];
            if dtype.bits() < 8 {
                // keep sub-byte tensors whole bytes: 2 (F4) or 4 (F6) elements a row
                shape.push(if dtype.bits() == 4 { 2 } else { 4 });
            }
            let len = super::dtype::byte_len(dtype, &shape).unwrap() as usize;
            prop::collection::vec(any::<u8>(), len).prop_map(move |bytes| Gen {
                name: name.clone(),
                dtype,
                shape: shape.clone(),
                bytes,
            })
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn writer_equals_reference_serialize(
        tensors in prop::collection::vec(arb_tensor(), 0..8),
        key in "[a-z]{0,5}",
        value in "[ -~é\\n]{0,8}",
    ) {
        let mut seen = std::collections::HashSet::new();
        let tensors: Vec<Gen> = tensors
            .into_iter()
            .filter(|t| t.name != "__metadata__" && seen.insert(t.name.clone()))
            .collect();
        let ours: Vec<Tensor<'_>> = tensors
            .iter()
            .map(|t| raw(&t.name, t.dtype, &t.shape, &t.bytes))
            .collect();
        let metadata = if key.is_empty() { BTreeMap::new() } else { meta(&[(&key, &value)]) };
        let mine = to_vec(&ours, &metadata);
        let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = tensors
            .iter()
            .map(|t| {
                let shape = t.shape.iter().map(|&d| d as usize).collect();
                (t.name.clone(), safetensors::tensor::TensorView::new(lib_dtype(t.dtype), shape, &t.bytes).unwrap())
            })
            .collect();
        let lib_meta = if key.is_empty() {
            None
        } else {
            Some(std::collections::HashMap::from([(key.clone(), value.clone())]))
        };
        let theirs = safetensors::tensor::serialize(views, lib_meta).unwrap();
        prop_assert_eq!(&mine, &theirs);
        // and our reader accepts what we wrote, tensor for tensor
        let h = parse_header(&mine).unwrap();
        prop_assert_eq!(h.tensors().len(), tensors.len());
        for t in &tensors {
            let info = h.get(&t.name).unwrap();
            prop_assert_eq!(info.dtype, t.dtype);
            prop_assert_eq!(&info.shape, &t.shape);
            let s = h.data_start() as usize;
            prop_assert_eq!(&mine[s + info.data_offsets.0 as usize..s + info.data_offsets.1 as usize], &t.bytes[..]);
        }
    }

    #[test]
    fn e4m3_encoding_is_nearest_even(x in -448.0f64..=448.0) {
        let code = f64_to_e4m3(x).unwrap();
        let v = f64::from(e4m3_to_f32(code));
        // No other code is strictly nearer; on a tie the chosen code is even.
        for c in 0u8..=255 {
            let w = f64::from(e4m3_to_f32(c));
            if w.is_nan() { continue; }
            let (d1, d2) = ((v - x).abs(), (w - x).abs());
            prop_assert!(d1 <= d2, "x={} code={:#x} but {:#x} is nearer", x, code, c);
            if d1 == d2 && w != v {
                prop_assert_eq!(code & 1, 0, "tie must go to the even code");
            }
        }
    }

    #[test]
    fn f64_bf16_is_one_rounding(bits in any::<u64>()) {
        let x = f64::from_bits(bits);
        prop_assume!(x.is_finite() && x.abs() < 3.0e38);
        let code = f64_to_bf16(x);
        let v = f64::from(bf16_to_f32(code));
        let up = f64::from(bf16_to_f32(code.wrapping_add(1)));
        let down = f64::from(bf16_to_f32(code.wrapping_sub(1)));
        for w in [up, down] {
            if w.is_finite() && (w.signum() == v.signum() || v == 0.0) {
                prop_assert!((v - x).abs() <= (w - x).abs());
            }
        }
    }
}

/// A file from a header text and a data buffer length (zero bytes of data).
fn file_from(json: &str, data: usize) -> Vec<u8> {
    let mut b = (json.len() as u64).to_le_bytes().to_vec();
    b.extend_from_slice(json.as_bytes());
    b.extend(std::iter::repeat_n(0u8, data));
    b
}

/// Broken headers with the rule each must name: duplicate keys, unknown entry keys and
/// missing ones.
fn key_cases() -> Vec<(SafetensorsError, &'static str)> {
    let e = |json: &str, data: usize| parse_header(&file_from(json, data)).unwrap_err();
    let t = r#""dtype":"F32","shape":[1],"data_offsets":[0,4]"#;
    vec![
        (
            e(&format!(r#"{{"a":{{{t}}},"a":{{{t}}}}}"#), 4),
            "rule-2-duplicate-key",
        ),
        (
            e(
                &format!(r#"{{"__metadata__":{{"k":"v","k":"w"}},"a":{{{t}}}}}"#),
                4,
            ),
            "rule-2-duplicate-key",
        ),
        (
            e(
                r#"{"a":{"dtype":"F32","dtype":"F32","shape":[1],"data_offsets":[0,4]}}"#,
                4,
            ),
            "rule-2-duplicate-key",
        ),
        (
            e(&format!(r#"{{"a":{{{t},"x":1}}}}"#), 4),
            "strict-entry-keys",
        ),
        (
            e(r#"{"a":{"dtype":"F32","shape":[1]}}"#, 4),
            "rule-4-tensor-entry",
        ),
    ]
}

/// Broken headers with the rule each must name: shapes, offsets, sizes, trailing bytes,
/// metadata, JSON syntax and tiling.
fn value_cases() -> Vec<(SafetensorsError, &'static str)> {
    let e = |json: &str, data: usize| parse_header(&file_from(json, data)).unwrap_err();
    let t = r#""dtype":"F32","shape":[1],"data_offsets":[0,4]"#;
    vec![
        (
            e(
                r#"{"a":{"dtype":"F32","shape":[1.0],"data_offsets":[0,4]}}"#,
                4,
            ),
            "rule-4-shape",
        ),
        (
            e(
                r#"{"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}}"#,
                4,
            ),
            "rule-4-shape",
        ),
        (
            e(
                r#"{"a":{"dtype":"F32","shape":["1"],"data_offsets":[0,4]}}"#,
                4,
            ),
            "rule-4-shape",
        ),
        (
            e(
                r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4.0]}}"#,
                4,
            ),
            "rule-4-data-offsets",
        ),
        (
            e(r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0]}}"#, 4),
            "rule-4-data-offsets",
        ),
        (
            e(
                r#"{"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,4]}}"#,
                4,
            ),
            "rule-4-overflow",
        ),
        (
            e(
                r#"{"a":{"dtype":"F4","shape":[3],"data_offsets":[0,1]}}"#,
                1,
            ),
            "rule-4-sub-byte-size",
        ),
        (
            e(&format!(r#"{{"a":{{{t}}}}} x"#), 4),
            "strict-trailing-bytes",
        ),
        (
            e(&format!("{{\"a\":{{{t}}}}}\0\0\0"), 4),
            "strict-trailing-bytes",
        ),
        (e(r#"{"__metadata__":{"k":1}}"#, 0), "rule-3-metadata"),
        (e(r#"{"__metadata__":["k"]}"#, 0), "rule-3-metadata"),
        (e(r#"[1,2]"#, 0), "rule-2-json"),
        (e(r#"{"a":"#, 0), "rule-2-json"),
        (e(&format!(r#"{{"a":{{{t}}}}}"#), 8), "rule-5-tiling"),
        (
            e(
                r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}"#,
                8,
            ),
            "rule-5-tiling",
        ),
        (e(&format!(r#"{{"a":{{{t}}}}}"#), 2), "rule-5-tiling"),
    ]
}

#[test]
fn strict_rules_name_the_rule() {
    let mut cases = key_cases();
    cases.extend(value_cases());
    for (err, rule) in cases {
        assert_eq!(err.rule(), Some(rule), "{err}");
        assert!(!err.to_string().contains('\n'));
    }
    let mut bad = file_from(r#"{"a":1}"#, 0);
    bad[10] = 0xFF;
    assert_eq!(parse_header(&bad).unwrap_err().rule(), Some("rule-2-utf8"));
    // Whitespace around the object, an empty header and zero-size tensors are valid.
    assert!(parse_header(&file_from("  {}  ", 0)).is_ok());
    assert!(parse_header(&file_from(
        r#"{"z":{"dtype":"F32","shape":[0,3],"data_offsets":[0,0]},"a":{"dtype":"U8","shape":[],"data_offsets":[0,1]}}"#,
        1
    ))
    .is_ok());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// Arbitrary bytes never panic the reader.
    #[test]
    fn reader_never_panics_on_arbitrary_bytes(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        let _ = parse_header(&bytes);
    }

    /// A valid file with one byte changed, or cut short, is read or rejected, never a
    /// panic; whatever is accepted stays inside the file.
    #[test]
    fn reader_survives_mutations(
        tensors in prop::collection::vec(arb_tensor(), 1..5),
        at in any::<prop::sample::Index>(),
        byte in any::<u8>(),
        cut in any::<bool>(),
    ) {
        let mut file = valid_file(&tensors);
        let i = at.index(file.len());
        if cut {
            file.truncate(i);
        } else {
            file[i] = byte;
        }
        if let Ok(h) = parse_header(&file) {
            assert_inside(&h, &file)?;
        }
    }
}

/// What a header body is built from: JSON syntax, the keys and values the rules look
/// at, and the edge cases the rules name (huge, negative and fractional numbers, NUL,
/// lone surrogates, raw non-ASCII, an unknown dtype).
const FRAGMENTS: &[&str] = &[
    "{",
    "}",
    "[",
    "]",
    ":",
    ",",
    " ",
    "\"",
    "\"a\"",
    "\"b\"",
    "\"__metadata__\"",
    "\"dtype\"",
    "\"shape\"",
    "\"data_offsets\"",
    "\"F32\"",
    "\"BF16\"",
    "\"F4\"",
    "\"U8\"",
    "\"Q9\"",
    "0",
    "1",
    "4",
    "8",
    "-1",
    "1.0",
    "1e3",
    "18446744073709551615",
    "18446744073709551616",
    "4294967296",
    "null",
    "true",
    "\"k\"",
    "\"v\"",
    "\"\\u0000\"",
    "\"\\ud800\"",
    "é",
    "\0",
    "\n",
    "x",
];

fn fragment() -> impl Strategy<Value = &'static str> {
    prop::sample::select(FRAGMENTS)
}

/// Any sequence of fragments: mostly not JSON, so it exercises the JSON parser itself.
fn fragment_soup() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(fragment(), 0..40).prop_map(|v| v.concat().into_bytes())
}

/// Objects of entries whose every slot is a fragment or a plausible value: valid JSON
/// most of the time, so the metadata and per-entry rules decide.
fn entry_soup() -> impl Strategy<Value = Vec<u8>> {
    let slot = || prop_oneof![fragment().prop_map(str::to_string), "[0-9]{1,2}"];
    let entry = (
        prop_oneof![Just("\"a\""), Just("\"b\""), Just("\"__metadata__\""), fragment()],
        prop_oneof![Just("\"F32\""), Just("\"U8\""), Just("\"F4\""), fragment()],
        prop::collection::vec(slot(), 0..3),
        (slot(), slot()),
        prop::option::of(fragment()),
    )
        .prop_map(|(name, dtype, shape, (begin, end), extra)| {
            let extra = extra.map_or(String::new(), |x| format!(",{x}:1"));
            format!(
                "{name}:{{\"dtype\":{dtype},\"shape\":[{}],\"data_offsets\":[{begin},{end}]{extra}}}",
                shape.join(",")
            )
        });
    prop::collection::vec(entry, 0..4)
        .prop_map(|entries| format!("{{{}}}", entries.join(",")).into_bytes())
}

/// One edit of a header body: delete up to 4 bytes, insert a fragment, or set a byte.
#[derive(Debug, Clone)]
enum Edit {
    Delete(prop::sample::Index, usize),
    Insert(prop::sample::Index, &'static str),
    Set(prop::sample::Index, u8),
}

fn edit() -> impl Strategy<Value = Edit> {
    let at = any::<prop::sample::Index>;
    prop_oneof![
        (at(), 1usize..5).prop_map(|(i, n)| Edit::Delete(i, n)),
        (at(), fragment()).prop_map(|(i, f)| Edit::Insert(i, f)),
        (at(), any::<u8>()).prop_map(|(i, b)| Edit::Set(i, b)),
    ]
}

fn apply(body: &mut Vec<u8>, edit: &Edit) {
    let len = body.len().max(1);
    match edit {
        Edit::Delete(i, n) => {
            let start = i.index(len).min(body.len());
            body.drain(start..(start + n).min(body.len()));
        }
        Edit::Insert(i, f) => {
            let at = i.index(len + 1).min(body.len());
            body.splice(at..at, f.bytes());
        }
        Edit::Set(i, b) => {
            if let Some(x) = body.get_mut(i.index(len)) {
                *x = *b;
            }
        }
    }
}

/// The canonical file of the generated tensors (the first of each name, none named
/// `__metadata__`), with one metadata entry.
fn valid_file(tensors: &[Gen]) -> Vec<u8> {
    let mut seen = std::collections::HashSet::new();
    let ours: Vec<Tensor<'_>> = tensors
        .iter()
        .filter(|t| t.name != "__metadata__" && seen.insert(t.name.clone()))
        .map(|t| raw(&t.name, t.dtype, &t.shape, &t.bytes))
        .collect();
    to_vec(&ours, &meta(&[("format", "tinyllm")]))
}

/// A valid file's header body after a few edits, with the file's own data.
fn edited_valid() -> impl Strategy<Value = (Vec<u8>, Vec<u8>)> {
    (
        prop::collection::vec(arb_tensor(), 0..4),
        prop::collection::vec(edit(), 1..4),
    )
        .prop_map(|(tensors, edits)| {
            let file = valid_file(&tensors);
            let n = u64::from_le_bytes(file[..8].try_into().unwrap()) as usize;
            let mut body = file[8..8 + n].to_vec();
            for e in &edits {
                apply(&mut body, e);
            }
            (body, file[8 + n..].to_vec())
        })
}

/// Length prefix, body and data: the prefix is always the body's length.
fn framed(body: &[u8], data: &[u8]) -> Vec<u8> {
    let mut file = (body.len() as u64).to_le_bytes().to_vec();
    file.extend_from_slice(body);
    file.extend_from_slice(data);
    file
}

/// Files whose length prefix fits: every one reaches the UTF-8 and JSON checks, and
/// most reach the metadata, entry and tiling rules.
fn consistent_file() -> impl Strategy<Value = Vec<u8>> {
    let data = || {
        prop_oneof![
            (0usize..64).prop_map(|n| vec![0u8; n]),
            prop::collection::vec(any::<u8>(), 0..16),
        ]
    };
    prop_oneof![
        1 => (fragment_soup(), data()).prop_map(|(b, d)| framed(&b, &d)),
        2 => (entry_soup(), data()).prop_map(|(b, d)| framed(&b, &d)),
        2 => edited_valid().prop_map(|(b, d)| framed(&b, &d)),
    ]
}

/// An accepted header describes the file it came from and stays inside it.
fn assert_inside(h: &Header, file: &[u8]) -> Result<(), TestCaseError> {
    prop_assert_eq!(h.file_size, file.len() as u64);
    for t in h.tensors() {
        prop_assert!(t.data_offsets.0 <= t.data_offsets.1);
        prop_assert!(h.data_start() + t.data_offsets.1 <= h.file_size);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// Length prefixes consistent with the buffer: the JSON parser and the per-entry
    /// rules see every case; none panics, whatever is accepted stays inside the file.
    #[test]
    fn reader_never_panics_on_consistent_prefixes(file in consistent_file()) {
        if let Ok(h) = parse_header(&file) {
            assert_inside(&h, &file)?;
        }
    }
}

/// Where each generated file stopped: the rule it broke, or "accepted".
fn verdicts(
    strategy: impl Strategy<Value = Vec<u8>>,
    cases: usize,
) -> BTreeMap<&'static str, usize> {
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let mut out = BTreeMap::new();
    for _ in 0..cases {
        let file = strategy.new_tree(&mut runner).unwrap().current();
        let verdict = match parse_header(&file) {
            Ok(_) => "accepted",
            Err(e) => e.rule().unwrap(),
        };
        *out.entry(verdict).or_insert(0) += 1;
    }
    out
}

/// The generators reach what they are for (a fixed seed, so the counts are stable):
/// random bytes almost never get past the length prefix, consistent prefixes always do,
/// and every rule of the header is broken by some case while some cases are accepted.
#[test]
fn consistent_prefixes_reach_the_json_and_entry_rules() {
    const CASES: usize = 2000;
    let old = verdicts(prop::collection::vec(any::<u8>(), 0..256), CASES);
    let new = verdicts(consistent_file(), CASES);
    eprintln!("arbitrary bytes: {old:?}\nconsistent prefixes: {new:?}");
    let past_length =
        |v: &BTreeMap<&str, usize>| CASES - v.get("rule-1-header-length").copied().unwrap_or(0);
    assert!(
        past_length(&old) * 50 < CASES,
        "arbitrary bytes now fit: {old:?}"
    );
    assert_eq!(past_length(&new), CASES, "{new:?}");
    let entry_level: usize = new
        .iter()
        .filter(|(rule, _)| !rule.starts_with("rule-2-json") && **rule != "rule-2-utf8")
        .map(|(_, n)| n)
        .sum();
    assert!(
        entry_level * 3 > CASES,
        "too few cases pass the JSON syntax: {new:?}"
    );
    for rule in [
        "accepted",
        "rule-2-utf8",
        "rule-2-json",
        "rule-2-duplicate-key",
        "strict-trailing-bytes",
        "rule-3-metadata",
        "rule-4-tensor-entry",
        "strict-entry-keys",
        "rule-4-dtype",
        "rule-4-shape",
        "rule-4-data-offsets",
        "rule-4-sub-byte-size",
        "rule-5-tiling",
    ] {
        assert!(
            new.get(rule).copied().unwrap_or(0) > 0,
            "{rule} never reached: {new:?}"
        );
    }
}

/// Every integer dtype (and BOOL) takes exactly the integers of its range: both ends
/// encode to their little-endian bytes, one past either end and a fraction refuse.
#[test]
fn integer_encoding_takes_exactly_its_range() {
    let two63 = 9_223_372_036_854_775_808.0;
    let two64 = 18_446_744_073_709_551_616.0;
    let cases: [(Dtype, f64, f64, Vec<u8>); 9] = [
        (Dtype::BOOL, 0.0, 1.0, vec![0, 1]),
        (Dtype::U8, 0.0, 255.0, vec![0, 255]),
        (Dtype::I8, -128.0, 127.0, vec![0x80, 0x7f]),
        (
            Dtype::U16,
            0.0,
            65_535.0,
            [0u16.to_le_bytes(), u16::MAX.to_le_bytes()].concat(),
        ),
        (
            Dtype::I16,
            -32_768.0,
            32_767.0,
            [i16::MIN.to_le_bytes(), i16::MAX.to_le_bytes()].concat(),
        ),
        (
            Dtype::U32,
            0.0,
            4_294_967_295.0,
            [0u32.to_le_bytes(), u32::MAX.to_le_bytes()].concat(),
        ),
        (
            Dtype::I32,
            -2_147_483_648.0,
            2_147_483_647.0,
            [i32::MIN.to_le_bytes(), i32::MAX.to_le_bytes()].concat(),
        ),
        // The largest f64 below 2^64 (and 2^63) is 2^64 - 2048 (2^63 - 1024).
        (
            Dtype::U64,
            0.0,
            two64 - 2048.0,
            [0u64.to_le_bytes(), (u64::MAX - 2047).to_le_bytes()].concat(),
        ),
        (
            Dtype::I64,
            -two63,
            two63 - 1024.0,
            [i64::MIN.to_le_bytes(), (i64::MAX - 1023).to_le_bytes()].concat(),
        ),
    ];
    for (dtype, min, max, bytes) in cases {
        let mut out = Vec::new();
        encode_f64(dtype, &[min, max], &mut out).unwrap();
        assert_eq!(out, bytes, "{dtype:?}");
        let above = if dtype == Dtype::U64 {
            two64
        } else if dtype == Dtype::I64 {
            two63
        } else {
            max + 1.0
        };
        let below = if dtype == Dtype::I64 {
            -two63 - 2048.0
        } else {
            min - 1.0
        };
        for bad in [below, above, 0.5, f64::NAN, f64::INFINITY] {
            let err = encode_f64(dtype, &[min, bad], &mut Vec::new()).unwrap_err();
            assert_eq!(
                (err.index, err.failure),
                (1, EncodeFailure::NotExact),
                "{dtype:?} {bad}"
            );
        }
    }
}

/// `convert` maps the input a chunk-sized window at a time: a tensor over several
/// windows, starting at an offset no page boundary falls on, and small tensors around
/// it, convert to the bytes `write` gives the same values in the target dtype.
#[test]
fn convert_across_windows_at_unaligned_offsets_equals_write() {
    use super::convert::{convert, CONVERT_CHUNK};
    let n = CONVERT_CHUNK / 4 * 2 + 777;
    let big: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin() * 1e3).collect();
    let odd: Vec<f32> = (0..13).map(|i| i as f32 / 3.0).collect();
    let ints = [1u8, 2, 3, 4, 5, 6, 7, 8];
    let m = meta(&[("k", "an odd-length value")]);
    let src = to_vec(
        &[
            f32s("a.big", Dtype::F32, &[n as u64], &big),
            f32s("b.odd", Dtype::F32, &[13], &odd),
            raw("c.ints", Dtype::I32, &[2], &ints),
        ],
        &m,
    );
    let want = to_vec(
        &[
            f32s("a.big", Dtype::BF16, &[n as u64], &big),
            f32s("b.odd", Dtype::BF16, &[13], &odd),
            raw("c.ints", Dtype::I32, &[2], &ints),
        ],
        &m,
    );
    let (dir, input) = roundtrip_file(&src);
    let output = dir.path().join("out.safetensors");
    let report = convert(&input, &output, Dtype::BF16, &|_| true, &mut |_, _| {}).unwrap();
    assert_eq!((report.converted, report.copied), (2, 1));
    assert!(std::fs::read(&output).unwrap() == want);
}
