//! A state dict saved through PyTorch's distributed checkpoint (`tlio.dcp`, scale.md
//! section 7): the chunk table's [`Group::Dcp`] holds every item under DCP's flattened
//! key (tensors with their chunks, DCP's bytes items as `U8` vectors), and the group's
//! metadata key [`DCP_META_KEY`] holds the JSON document from which DCP's `Metadata` is
//! rebuilt on load: which items are bytes, each tensor's properties, the planner's key
//! mapping. No pickle is stored; tlio never decodes a bytes item.
//!
//! Invariants (checked whenever a table holding the group is built or read, so on
//! commit and on open): the document parses with no unknown key and is of
//! [`DCP_FORMAT`] version [`DCP_DOC_VERSION`]; its bytes items are sorted, unique, and
//! each a one-dimensional `U8` tensor of the group; every other tensor of the group has
//! properties whose dtype is the torch name of its stored dtype, and no properties name
//! a tensor the group lacks; the planner's mapping is sorted by key without duplicates.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::table::{Group, ShardsTable};
use super::{table_err, ShardedError, SHARDS_NAME};
use crate::safetensors::dtype::Dtype;

/// The document's `format`.
pub const DCP_FORMAT: &str = "tlio-dcp";
/// The document version this code writes and reads.
pub const DCP_DOC_VERSION: u64 = 1;
/// Its key in the group's metadata.
pub const DCP_META_KEY: &str = "metadata";
/// Most elements of one planner path (DCP's are a few keys deep).
const MAX_PATH_ELEMS: usize = 64;

/// torch's dtype names (`str(dtype)` less `torch.`) and the safetensors dtype each is
/// stored as.
pub const TORCH_DTYPES: [(&str, Dtype); 13] = [
    ("float64", Dtype::F64),
    ("float32", Dtype::F32),
    ("float16", Dtype::F16),
    ("bfloat16", Dtype::BF16),
    ("int64", Dtype::I64),
    ("int32", Dtype::I32),
    ("int16", Dtype::I16),
    ("int8", Dtype::I8),
    ("uint8", Dtype::U8),
    ("bool", Dtype::BOOL),
    ("complex64", Dtype::C64),
    ("float8_e4m3fn", Dtype::F8_E4M3),
    ("float8_e5m2", Dtype::F8_E5M2),
];

/// A tensor's `TensorProperties` as DCP's metadata holds them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TensorProperties {
    /// torch's name of the dtype (`float32`).
    pub dtype: String,
    /// Whether the saved tensor required grad.
    pub requires_grad: bool,
    /// The saved strides, when the torch version records them.
    pub strides: Option<Vec<i64>>,
}

/// One element of a planner path: a state-dict key or a list index.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum PathElem {
    /// A list index.
    Index(u64),
    /// A dict key.
    Key(String),
}

/// The default planner's data: each flattened key and the path it came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlannerData {
    /// (flattened key, path), sorted by key.
    pub mappings: Vec<(String, Vec<PathElem>)>,
}

/// One tensor of a Hugging Face export ([`HfExport`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HfTensor {
    /// The tensor's name in the Hugging Face model directory.
    pub name: String,
    /// The flattened DCP key of the stored tensor it is.
    pub from: String,
    /// For a 2-D projection whose rows hold rotary pairs interleaved per head (Meta's
    /// llama layout): the number of heads. `ckpt export` reorders each head's rows from
    /// (pair, 2) to (2, pair), the layout of Hugging Face's rotate-half rotary embedding.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rotary_heads: Option<u64>,
}

/// The rule `ckpt export` applies to a DCP state dict: written at save time by the
/// integration that knows the model (`tlio.torchtitan`), so this crate knows no
/// framework's names. Tensors sorted by name without duplicates.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HfExport {
    /// The exported tensors.
    pub tensors: Vec<HfTensor>,
}

/// The document that replaces DCP's pickled `Metadata`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DcpDocument {
    /// [`DCP_FORMAT`].
    pub format: String,
    /// [`DCP_DOC_VERSION`].
    pub version: u64,
    /// DCP's own metadata version string, handed back on load.
    pub dcp_version: String,
    /// The flattened keys of the bytes items, sorted.
    pub bytes: Vec<String>,
    /// Every tensor item's properties.
    pub tensors: BTreeMap<String, TensorProperties>,
    /// The planner's data, or none.
    pub planner_data: Option<PlannerData>,
    /// How `ckpt export` writes the model as a Hugging Face directory, when the saver
    /// said (absent from documents without one, which stay byte for byte as before).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hf_export: Option<HfExport>,
}

fn doc_err(reason: impl Into<String>) -> ShardedError {
    table_err(format!("{SHARDS_NAME}: dcp {DCP_META_KEY}"), reason)
}

/// The stored dtype of a torch dtype name.
pub fn torch_dtype(name: &str) -> Option<Dtype> {
    TORCH_DTYPES
        .iter()
        .find(|(n, _)| *n == name)
        .map(|&(_, d)| d)
}

impl DcpDocument {
    /// Parse the document's text (the rules against a table are [`check`]'s).
    pub fn from_json(text: &str) -> Result<Self, ShardedError> {
        let doc: DcpDocument = serde_json::from_str(text).map_err(|e| doc_err(e.to_string()))?;
        if doc.format != DCP_FORMAT || doc.version != DCP_DOC_VERSION {
            return Err(doc_err(format!(
                "format {:?} version {}, not {DCP_FORMAT:?} version {DCP_DOC_VERSION}",
                doc.format, doc.version
            )));
        }
        Ok(doc)
    }

    /// The canonical text: compact JSON, keys in a fixed order.
    pub fn to_json(&self) -> String {
        // Plain structs of strings, integers and maps serialise without failure.
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// The document of `table`'s DCP group, checked against its tensors; `None` when the
/// table holds no DCP state.
pub fn document(table: &ShardsTable) -> Result<Option<DcpDocument>, ShardedError> {
    if !table.has_dcp() {
        return Ok(None);
    }
    let meta = table.meta.get(&Group::Dcp);
    if let Some(extra) = meta.and_then(|m| m.keys().find(|k| *k != DCP_META_KEY)) {
        return Err(doc_err(format!(
            "the dcp group's metadata holds {extra:?}, beside {DCP_META_KEY:?} only"
        )));
    }
    let text = meta
        .and_then(|m| m.get(DCP_META_KEY))
        .ok_or_else(|| doc_err("the table holds dcp tensors without their document"))?;
    let doc = DcpDocument::from_json(text)?;
    check(&doc, table)?;
    Ok(Some(doc))
}

/// Every rule of the module documentation between `doc` and `table`.
pub fn check(doc: &DcpDocument, table: &ShardsTable) -> Result<(), ShardedError> {
    if doc.bytes.windows(2).any(|w| w.first() >= w.get(1)) {
        return Err(doc_err("bytes items are not sorted without duplicates"));
    }
    for name in &doc.bytes {
        let t = table
            .get(Group::Dcp, name)
            .ok_or_else(|| doc_err(format!("bytes item {name:?} is not in the table")))?;
        if t.dtype != Dtype::U8 || t.shape.len() != 1 {
            return Err(doc_err(format!(
                "bytes item {name:?} is {} {:?}, not a U8 vector",
                t.dtype, t.shape
            )));
        }
    }
    for t in table.tensors.iter().filter(|t| t.group == Group::Dcp) {
        if doc.bytes.binary_search(&t.name).is_ok() {
            continue;
        }
        let props = doc
            .tensors
            .get(&t.name)
            .ok_or_else(|| doc_err(format!("tensor {:?} has no properties", t.name)))?;
        if torch_dtype(&props.dtype) != Some(t.dtype) {
            return Err(doc_err(format!(
                "tensor {:?} is stored as {}, its properties say {:?}",
                t.name, t.dtype, props.dtype
            )));
        }
    }
    if let Some(name) = doc
        .tensors
        .keys()
        .find(|n| table.get(Group::Dcp, n).is_none() || doc.bytes.binary_search(n).is_ok())
    {
        return Err(doc_err(format!(
            "properties of {name:?}, which is no tensor of the table"
        )));
    }
    if let Some(hf) = &doc.hf_export {
        check_hf_export(hf, doc, table)?;
    }
    if let Some(pd) = &doc.planner_data {
        if pd.mappings.windows(2).any(|w| {
            let (a, b) = (w.first().map(|m| &m.0), w.get(1).map(|m| &m.0));
            a >= b
        }) {
            return Err(doc_err(
                "planner mappings are not sorted without duplicates",
            ));
        }
        if let Some((key, _)) = pd.mappings.iter().find(|(_, p)| p.len() > MAX_PATH_ELEMS) {
            return Err(doc_err(format!(
                "the planner path of {key:?} has more than {MAX_PATH_ELEMS} elements"
            )));
        }
    }
    Ok(())
}

/// The rules of [`HfExport`]: names sorted and unique, each source a tensor (not a
/// bytes item) of the group, each rotary source 2-D with rows a multiple of twice its
/// (non-zero) heads.
fn check_hf_export(
    hf: &HfExport,
    doc: &DcpDocument,
    table: &ShardsTable,
) -> Result<(), ShardedError> {
    if hf
        .tensors
        .windows(2)
        .any(|w| w.first().map(|t| &t.name) >= w.get(1).map(|t| &t.name))
    {
        return Err(doc_err(
            "hf_export tensors are not sorted by name without duplicates",
        ));
    }
    for t in &hf.tensors {
        let src = table
            .get(Group::Dcp, &t.from)
            .filter(|_| doc.bytes.binary_search(&t.from).is_err())
            .ok_or_else(|| {
                doc_err(format!(
                    "hf_export {:?} is made of {:?}, which is no tensor of the table",
                    t.name, t.from
                ))
            })?;
        if let Some(heads) = t.rotary_heads {
            let rows = src.shape.first().copied().unwrap_or(0);
            let fits = heads > 0
                && src.shape.len() == 2
                && heads.checked_mul(2).is_some_and(|h2| rows % h2 == 0);
            if !fits {
                return Err(doc_err(format!(
                    "hf_export {:?}: {:?} of shape {:?} is not 2-D with rows a multiple of 2 x {heads} rotary heads",
                    t.name, t.from, src.shape
                )));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::table::{ChunkEntry, TableTensor};
    use super::*;

    fn tensor(name: &str, dtype: Dtype, len: u64, begin: u64) -> TableTensor {
        TableTensor {
            group: Group::Dcp,
            name: name.to_string(),
            dtype,
            shape: vec![len],
            chunks: vec![ChunkEntry {
                offsets: vec![0],
                sizes: vec![len],
                file: "dcp-rank00000.safetensors".into(),
                key: name.to_string(),
                begin,
                end: begin + len * dtype.size().unwrap_or(1) as u64,
                pieces: vec!["0".repeat(64)],
            }],
        }
    }

    fn doc() -> DcpDocument {
        DcpDocument {
            format: DCP_FORMAT.into(),
            version: DCP_DOC_VERSION,
            dcp_version: "1.0.0".into(),
            bytes: vec!["extra.epoch".into()],
            tensors: [(
                "model.w".to_string(),
                TensorProperties {
                    dtype: "float32".into(),
                    requires_grad: true,
                    strides: None,
                },
            )]
            .into(),
            planner_data: Some(PlannerData {
                mappings: vec![
                    (
                        "extra.epoch".into(),
                        vec![PathElem::Key("extra".into()), PathElem::Key("epoch".into())],
                    ),
                    ("optim.g.0".into(), vec![PathElem::Index(0)]),
                ],
            }),
            hf_export: None,
        }
    }

    fn table(doc: &DcpDocument) -> Result<ShardsTable, ShardedError> {
        let meta = [(
            Group::Dcp,
            [(DCP_META_KEY.to_string(), doc.to_json())].into(),
        )]
        .into();
        let tensors = vec![
            tensor("extra.epoch", Dtype::U8, 3, 0),
            tensor("model.w", Dtype::F32, 2, 8),
        ];
        ShardsTable::new(super::super::PIECE_BYTES, meta, tensors)
    }

    #[test]
    fn a_table_of_dcp_state_round_trips_as_version_2_with_its_document() {
        let t = table(&doc()).unwrap();
        let json = t.to_json();
        assert!(json.starts_with(br#"{"format":"tlio-shards","version":2,"#));
        let back = ShardsTable::from_json(&json).unwrap();
        assert_eq!(back, t);
        assert_eq!(document(&back).unwrap(), Some(doc()));
    }

    #[test]
    fn a_version_1_table_holding_dcp_state_is_refused() {
        let json = table(&doc()).unwrap().to_json();
        let text = String::from_utf8(json)
            .unwrap()
            .replacen("\"version\":2", "\"version\":1", 1);
        let err = ShardsTable::from_json(text.as_bytes()).unwrap_err();
        assert!(err.to_string().contains("dcp group"), "{err}");
    }

    #[test]
    fn documents_that_disagree_with_the_table_are_refused_naming_the_item() {
        let mut wrong_dtype = doc();
        wrong_dtype.tensors.get_mut("model.w").unwrap().dtype = "bfloat16".into();
        let mut unknown = doc();
        unknown
            .tensors
            .insert("model.gone".into(), unknown.tensors["model.w"].clone());
        let mut no_props = doc();
        no_props.tensors.clear();
        let mut bytes_not_u8 = doc();
        bytes_not_u8.bytes = vec!["extra.epoch".into(), "model.w".into()];
        let mut unsorted = doc();
        unsorted.planner_data.as_mut().unwrap().mappings.reverse();
        for (d, word) in [
            (wrong_dtype, "model.w"),
            (unknown, "model.gone"),
            (no_props, "model.w"),
            (bytes_not_u8, "model.w"),
            (unsorted, "planner"),
        ] {
            let err = table(&d).map(|_| ()).unwrap_err();
            assert!(err.to_string().contains(word), "{err}");
        }
        let mut other = doc();
        other.version = 9;
        let err = DcpDocument::from_json(&other.to_json()).unwrap_err();
        assert!(err.to_string().contains("version 9"), "{err}");
        let err = DcpDocument::from_json(r#"{"format":"tlio-dcp","pickle":1}"#).unwrap_err();
        assert!(err.to_string().contains("unknown field"), "{err}");
    }

    fn hf(name: &str, from: &str, rotary_heads: Option<u64>) -> HfTensor {
        HfTensor {
            name: name.into(),
            from: from.into(),
            rotary_heads,
        }
    }

    #[test]
    fn an_hf_export_rule_is_kept_and_checked_against_the_table() {
        let mut d = doc();
        d.hf_export = Some(HfExport {
            tensors: vec![hf("model.embed.weight", "model.w", None)],
        });
        let t = table(&d).unwrap();
        let back = document(&t).unwrap().unwrap();
        assert_eq!(back.hf_export, d.hf_export);
        // A document without a rule serialises with no hf_export key at all.
        assert!(!doc().to_json().contains("hf_export"));
        for (tensors, word) in [
            (vec![hf("a", "model.gone", None)], "model.gone"),
            (vec![hf("a", "extra.epoch", None)], "extra.epoch"),
            (
                vec![hf("b", "model.w", None), hf("a", "model.w", None)],
                "sorted",
            ),
            (vec![hf("a", "model.w", Some(1))], "rotary heads"),
            (vec![hf("a", "model.w", Some(0))], "rotary heads"),
        ] {
            let mut bad = doc();
            bad.hf_export = Some(HfExport { tensors });
            let err = table(&bad).map(|_| ()).unwrap_err();
            assert!(err.to_string().contains(word), "{err}");
        }
    }

    proptest::proptest! {
        #[test]
        fn documents_round_trip_through_their_json(
            keys in proptest::collection::btree_set("[a-z.]{1,8}", 0..6),
            index in 0u64..1000,
        ) {
            let mut d = doc();
            d.planner_data = Some(PlannerData {
                mappings: keys.iter().map(|k| (k.clone(), vec![PathElem::Key(k.clone()), PathElem::Index(index)])).collect(),
            });
            proptest::prop_assert_eq!(DcpDocument::from_json(&d.to_json()).unwrap(), d);
        }
    }
}
