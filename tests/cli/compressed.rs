//! Compressed corpora: a zstd stream with skippable frames decodes as the reference
//! decoder does, and a corrupt or truncated gzip or zstd input is one readable line of
//! bad data, never a library's debug text or a partial shard.

use super::{pack_text as pack, run_without_panic as run, shard_ids as ids, tmp};

/// A skippable zstd frame (RFC 8878) of `len` bytes.
fn skippable(len: u32) -> Vec<u8> {
    let mut v = 0x184D_2A50u32.to_le_bytes().to_vec();
    v.extend(len.to_le_bytes());
    v.extend(std::iter::repeat_n(7u8, len as usize));
    v
}

#[test]
fn a_zstd_stream_with_skippable_frames_decodes_as_zstd_dc_does() {
    let dir = tmp();
    let frame = |t: &str| {
        ruzstd::encoding::compress_to_vec(t.as_bytes(), ruzstd::encoding::CompressionLevel::Fastest)
    };
    let mut bytes = skippable(8);
    bytes.extend(frame("hello "));
    bytes.extend(skippable(0));
    bytes.extend(frame("world"));
    bytes.extend(skippable(3));
    let input = dir.path().join("s.txt.zst");
    std::fs::write(&input, &bytes).unwrap();
    let out = dir.path().join("s.bin");
    let (code, err) = run(&mut pack(&input, "gpt2", &out));
    assert_eq!(code, Some(0), "{err}");
    // The end-of-text, then "hello world" exactly as gpt2 encodes it.
    assert_eq!(ids(&out), [50256, 31373, 995]);
}

#[test]
fn corrupt_or_truncated_gzip_and_zstd_are_bad_data_in_one_readable_line() {
    let dir = tmp();
    let gz = {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        std::io::Write::write_all(&mut e, "hello world ".repeat(100).as_bytes()).unwrap();
        e.finish().unwrap()
    };
    let zst = ruzstd::encoding::compress_to_vec(
        "hello world ".repeat(100).as_bytes(),
        ruzstd::encoding::CompressionLevel::Fastest,
    );
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("trunc.txt.gz", gz.get(..20).unwrap().to_vec()),
        ("bad.txt.gz", b"garbage garbage".to_vec()),
        ("trunc.txt.zst", zst.get(..10).unwrap().to_vec()),
        ("short.txt.zst", zst.get(..3).unwrap().to_vec()),
        ("empty.txt.zst", Vec::new()),
        ("bad.txt.zst", b"garbage garbage".to_vec()),
        ("skip.txt.zst", skippable(100).get(..50).unwrap().to_vec()),
    ];
    for (name, bytes) in cases {
        let input = dir.path().join(name);
        std::fs::write(&input, bytes).unwrap();
        let out = dir.path().join("o.bin");
        let (code, err) = run(&mut pack(&input, "gpt2", &out));
        assert_eq!(code, Some(1), "{name}: {err}");
        assert_eq!(err.lines().count(), 1, "{name}: {err}");
        assert!(
            err.contains(name) && err.contains("not valid"),
            "{name}: {err}"
        );
        for debug in ["Error {", "kind:", "MagicNumber", "SkipFrame", "(Error"] {
            assert!(!err.contains(debug), "{name}: {err}");
        }
        assert!(!out.exists(), "{name}");
    }
}
