//! Golden tests against files written by the Python safetensors 0.8 library and vectors
//! computed by ml_dtypes / numpy / an exact oracle (fixtures/safetensors/README.md).

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::Value;
use sha2::{Digest, Sha256};

use super::float::*;
use super::*;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/safetensors")
}

fn manifest() -> Value {
    let text = std::fs::read_to_string(root().join("golden/MANIFEST.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn shape_of(t: &Value) -> Vec<u64> {
    t["shape"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_u64().unwrap())
        .collect()
}

fn metadata_of(f: &Value) -> BTreeMap<String, String> {
    f["metadata"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_string()))
        .collect()
}

/// The float32 values the library cast from, per tensor (None for raw tensors).
fn f32_inputs_of(tensors: &[Value]) -> Vec<Option<Vec<f32>>> {
    tensors
        .iter()
        .map(|t| {
            t.get("encoded_from_f32_bits").map(|v| {
                v.as_array()
                    .unwrap()
                    .iter()
                    .map(|b| f32::from_bits(u32::from_str_radix(b.as_str().unwrap(), 16).unwrap()))
                    .collect()
            })
        })
        .collect()
}

/// The manifest's tensors as raw-byte tensors over `data`, noting each dtype seen.
fn raw_tensors<'a>(
    tensors: &[Value],
    data: &'a [Vec<u8>],
    dtypes_seen: &mut std::collections::BTreeSet<Dtype>,
) -> Vec<Tensor<'a>> {
    tensors
        .iter()
        .zip(data)
        .map(|(t, d)| {
            let dtype = Dtype::from_name(t["dtype"].as_str().unwrap()).unwrap();
            dtypes_seen.insert(dtype);
            Tensor {
                name: t["name"].as_str().unwrap().to_string(),
                dtype,
                shape: shape_of(t),
                data: TensorData::Raw(Cow::Borrowed(d)),
            }
        })
        .collect()
}

#[test]
fn test_matches_library_bytes() {
    let m = manifest();
    let files = m["files"].as_array().unwrap();
    assert!(files.len() >= 40);
    let mut dtypes_seen = std::collections::BTreeSet::new();
    let mut from_values = 0;
    for f in files {
        let name = f["file"].as_str().unwrap();
        let bytes = std::fs::read(root().join("golden").join(name)).unwrap();
        assert_eq!(
            format!("{:x}", Sha256::digest(&bytes)),
            f["sha256"].as_str().unwrap(),
            "{name}"
        );
        let tensors = f["tensors"].as_array().unwrap();
        let data: Vec<Vec<u8>> = tensors
            .iter()
            .map(|t| hex(t["data_hex"].as_str().unwrap()))
            .collect();
        let f32_inputs = f32_inputs_of(tensors);
        let meta = metadata_of(f);
        // Raw bytes, every tensor.
        let raw = raw_tensors(tensors, &data, &mut dtypes_seen);
        let mut ours = Vec::new();
        write(&mut ours, &raw, &meta).unwrap();
        // The same file with every tensor the library cast from float32 given as values.
        let encoded: Vec<Tensor<'_>> = raw
            .iter()
            .zip(&f32_inputs)
            .map(|(t, v)| match v {
                Some(values) => Tensor {
                    data: TensorData::F32(values),
                    ..t.clone()
                },
                None => t.clone(),
            })
            .collect();
        let mut ours_from_values = Vec::new();
        write(&mut ours_from_values, &encoded, &meta).unwrap();
        if f32_inputs.iter().any(Option::is_some) {
            from_values += 1;
        }
        if f["writer_reproduces"].as_bool().unwrap() {
            assert!(
                ours == bytes,
                "{name}: writer bytes differ from the library's"
            );
            assert!(
                ours_from_values == bytes,
                "{name}: encoding the f32 values differs"
            );
        } else {
            assert!(ours != bytes, "{name}: expected to differ from the library");
            assert!(parse_header(&ours).is_ok());
        }
    }
    assert_eq!(
        dtypes_seen.len(),
        20,
        "every dtype the library writes (all but F6)"
    );
    assert!(
        from_values >= 5,
        "at least five files written from float32 values"
    );
}

fn f64_of(s: &str) -> Option<f64> {
    (s != "nan").then(|| f64::from_bits(u64::from_str_radix(s, 16).unwrap()))
}

/// The tensor's f64 and f32 decodings equal the manifest's `f64_values` bitwise (NaN
/// as NaN); false when the manifest lists no values for it.
fn check_float_values(file: &MappedFile, info: &TensorInfo, t: &Value, name: &str) -> bool {
    let Some(values) = t.get("f64_values") else {
        return false;
    };
    let tname = info.name.as_str();
    let want: Vec<Option<f64>> = values
        .as_array()
        .unwrap()
        .iter()
        .map(|v| f64_of(v.as_str().unwrap()))
        .collect();
    let got64 = file.decode_f64(tname).unwrap();
    let got32 = file.decode_f32(tname).unwrap();
    assert_eq!(got64.len(), want.len());
    for (i, w) in want.iter().enumerate() {
        match w {
            None => assert!(
                got64[i].is_nan() && got32[i].is_nan(),
                "{name}/{tname}[{i}]"
            ),
            Some(w) => {
                // Bitwise, so signed zeros and subnormals count.
                assert_eq!(got64[i].to_bits(), w.to_bits(), "{name}/{tname}[{i}]");
                if info.dtype != Dtype::F64 {
                    assert_eq!(
                        f64::from(got32[i]).to_bits(),
                        w.to_bits(),
                        "{name}/{tname}[{i}] f32"
                    );
                }
            }
        }
    }
    true
}

/// The tensor's integer decoding equals the manifest's `ints`; false when it lists none.
fn check_ints(file: &MappedFile, t: &Value, name: &str) -> bool {
    let Some(ints) = t.get("ints") else {
        return false;
    };
    let tname = t["name"].as_str().unwrap();
    let want: Vec<i128> = ints
        .as_array()
        .unwrap()
        .iter()
        .map(|v| {
            v.as_i64()
                .map(i128::from)
                .unwrap_or_else(|| i128::from(v.as_u64().unwrap()))
        })
        .collect();
    assert_eq!(file.decode_ints(tname).unwrap(), want, "{name}/{tname}");
    true
}

#[test]
fn test_load_decodes_every_dtype() {
    let m = manifest();
    let mut decoded = std::collections::BTreeSet::new();
    for f in m["files"].as_array().unwrap() {
        let name = f["file"].as_str().unwrap();
        let path = root().join("golden").join(name);
        let header = read_header(&path).unwrap();
        assert_eq!(
            header.header_len,
            f["header_len"].as_u64().unwrap(),
            "{name}"
        );
        assert_eq!(header.file_size, f["size"].as_u64().unwrap(), "{name}");
        assert_eq!(header.metadata, metadata_of(f), "{name}");
        let file = MappedFile::open(&path).unwrap();
        assert_eq!(file.header(), &header);
        let tensors = f["tensors"].as_array().unwrap();
        assert_eq!(header.tensors().len(), tensors.len(), "{name}");
        for (info, t) in header.tensors().iter().zip(tensors) {
            let tname = t["name"].as_str().unwrap();
            assert_eq!(info.name, tname, "{name}: file order");
            assert_eq!(info.dtype.name(), t["dtype"].as_str().unwrap());
            assert_eq!(info.shape, shape_of(t));
            let offs = t["data_offsets"].as_array().unwrap();
            assert_eq!(
                info.data_offsets,
                (offs[0].as_u64().unwrap(), offs[1].as_u64().unwrap())
            );
            let raw = file.tensor_bytes(tname).unwrap();
            assert_eq!(raw, hex(t["data_hex"].as_str().unwrap()), "{name}/{tname}");
            let floats = check_float_values(&file, info, t, name);
            let ints = check_ints(&file, t, name);
            if floats || ints {
                decoded.insert(info.dtype);
            }
        }
    }
    // Every dtype with a defined decoding: 9 float kinds, 8 integer kinds, BOOL.
    assert_eq!(decoded.len(), 18, "{decoded:?}");
}

fn read_vec<const N: usize>(name: &str) -> Vec<[u8; N]> {
    let bytes = std::fs::read(root().join("vectors").join(name)).unwrap();
    assert_eq!(bytes.len() % N, 0);
    bytes
        .chunks_exact(N)
        .map(|c| c.try_into().unwrap())
        .collect()
}

fn u16s(name: &str) -> Vec<u16> {
    read_vec::<2>(name)
        .iter()
        .map(|b| u16::from_le_bytes(*b))
        .collect()
}

fn u8s(name: &str) -> Vec<u8> {
    read_vec::<1>(name).iter().map(|b| b[0]).collect()
}

fn one_f32(dtype: Dtype, x: f32) -> Result<Vec<u8>, EncodeError> {
    let mut out = Vec::new();
    encode_f32(dtype, &[x], &mut out).map(|()| out)
}

fn one_f64(dtype: Dtype, x: f64) -> Result<Vec<u8>, EncodeError> {
    let mut out = Vec::new();
    encode_f64(dtype, &[x], &mut out).map(|()| out)
}

/// The encoders agree with ml_dtypes/numpy on every in-range float32 input of the
/// committed vectors (>= 100,000 values: ties, near-ties, subnormals, boundaries,
/// random), raise exactly where F8_E4M3 is out of range, and round f64 once.
#[test]
fn encoders_agree_with_ml_dtypes_vectors() {
    f32_encoders_agree();
    f64_encoders_agree();
}

/// BF16, F16, E5M2 and E4M3 (with its out-of-range refusals) of every f32 input.
fn f32_encoders_agree() {
    let inputs: Vec<f32> = read_vec::<4>("f32_inputs.bin")
        .iter()
        .map(|b| f32::from_le_bytes(*b))
        .collect();
    assert!(inputs.len() >= 100_000);
    let bf16: Vec<u16> = u16s("f32_to_bf16.bin");
    let f16: Vec<u16> = u16s("f32_to_f16.bin");
    let e4m3: Vec<u8> = u8s("f32_to_f8_e4m3.bin");
    let oor: Vec<u8> = u8s("f32_to_f8_e4m3_out_of_range.bin");
    let e5m2: Vec<u8> = u8s("f32_to_f8_e5m2.bin");
    let mut raised = 0;
    for (i, &x) in inputs.iter().enumerate() {
        let b = u16::from_le_bytes(one_f32(Dtype::BF16, x).unwrap().try_into().unwrap());
        assert_eq!(b, bf16[i], "BF16 of {:#x}", x.to_bits());
        let h = u16::from_le_bytes(one_f32(Dtype::F16, x).unwrap().try_into().unwrap());
        if x.is_nan() {
            // numpy keeps NaN payload bits; tlio writes the canonical quiet NaN.
            assert!(half::f16::from_bits(h).is_nan() && (h & 0x8000) == (f16[i] & 0x8000));
        } else {
            assert_eq!(h, f16[i], "F16 of {:#x}", x.to_bits());
        }
        assert_eq!(
            one_f32(Dtype::F8_E5M2, x).unwrap(),
            [e5m2[i]],
            "E5M2 of {:#x}",
            x.to_bits()
        );
        match one_f32(Dtype::F8_E4M3, x) {
            Ok(code) => {
                assert_eq!(oor[i], 0, "E4M3 of {:#x} must raise", x.to_bits());
                assert_eq!(code, [e4m3[i]], "E4M3 of {:#x}", x.to_bits());
            }
            Err(e) => {
                assert_eq!(oor[i], 1, "E4M3 of {:#x} must not raise", x.to_bits());
                assert_eq!(e.failure, EncodeFailure::OutOfRange);
                raised += 1;
            }
        }
    }
    assert!(raised > 60_000);
}

/// The same four encodings of every f64 input, each a single rounding.
fn f64_encoders_agree() {
    let inputs: Vec<f64> = read_vec::<8>("f64_inputs.bin")
        .iter()
        .map(|b| f64::from_le_bytes(*b))
        .collect();
    let bf16: Vec<u16> = u16s("f64_to_bf16.bin");
    let f16: Vec<u16> = u16s("f64_to_f16.bin");
    let e4m3: Vec<u8> = u8s("f64_to_f8_e4m3.bin");
    let oor: Vec<u8> = u8s("f64_to_f8_e4m3_out_of_range.bin");
    let e5m2: Vec<u8> = u8s("f64_to_f8_e5m2.bin");
    for (i, &x) in inputs.iter().enumerate() {
        let b = u16::from_le_bytes(one_f64(Dtype::BF16, x).unwrap().try_into().unwrap());
        assert_eq!(b, bf16[i], "BF16 of f64 {:#x}", x.to_bits());
        let h = u16::from_le_bytes(one_f64(Dtype::F16, x).unwrap().try_into().unwrap());
        assert_eq!(h, f16[i], "F16 of f64 {:#x}", x.to_bits());
        assert_eq!(
            one_f64(Dtype::F8_E5M2, x).unwrap(),
            [e5m2[i]],
            "E5M2 of f64 {:#x}",
            x.to_bits()
        );
        match one_f64(Dtype::F8_E4M3, x) {
            Ok(code) => {
                assert_eq!(oor[i], 0, "E4M3 of f64 {:#x} must raise", x.to_bits());
                assert_eq!(code, [e4m3[i]], "E4M3 of f64 {:#x}", x.to_bits());
            }
            Err(_) => assert_eq!(oor[i], 1, "E4M3 of f64 {:#x} must not raise", x.to_bits()),
        }
    }
}

#[test]
fn decoders_agree_with_ml_dtypes_tables() {
    type Decoder = fn(u8) -> f32;
    let tables: [(&str, Decoder); 5] = [
        ("decode_f8_e4m3.bin", e4m3_to_f32),
        ("decode_f8_e5m2.bin", e5m2_to_f32),
        ("decode_f8_e4m3fnuz.bin", e4m3fnuz_to_f32),
        ("decode_f8_e5m2fnuz.bin", e5m2fnuz_to_f32),
        ("decode_f8_e8m0.bin", e8m0_to_f32),
    ];
    for (file, decode) in tables {
        let want: Vec<u32> = read_vec::<4>(file)
            .iter()
            .map(|b| u32::from_le_bytes(*b))
            .collect();
        assert_eq!(want.len(), 256);
        for code in 0..=255u8 {
            let got = decode(code);
            let w = f32::from_bits(want[code as usize]);
            if w.is_nan() {
                assert!(got.is_nan(), "{file} code {code:#x}");
            } else {
                assert_eq!(got.to_bits(), w.to_bits(), "{file} code {code:#x}");
            }
        }
    }
}
