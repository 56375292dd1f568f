//! Models as users meet them: one safetensors file, a Hugging Face sharded index
//! (`*.index.json` + shards), or a model directory (`config.json` and either
//! `model.safetensors.index.json` or `model.safetensors`). [`Model`] opens any of the
//! three and yields logical tensors whatever the sharding; int4 pairs
//! (`<name>.qweight` + `<name>.scales`) are one logical `[out, in]` tensor.
//!
//! Invariants: opening reads headers and small JSON files only; every index rule,
//! reader rule, architecture rule and int4 rule that fails becomes one [`Finding`]
//! naming the tensor, shard or key and the rule, never a panic; shard names from an
//! index are plain file names beside the index (so an index cannot direct tlio to
//! another path), while a shard that is itself a symlink is followed, as the Hugging
//! Face cache needs.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::safetensors::verify::{Finding, Findings};
use crate::safetensors::{Dtype, Header, TensorInfo};
use config::{check_tokenizer, read_config};

pub mod arch;
mod config;
mod error;
pub mod files;
pub mod index;
pub mod int4;
mod int4_avx2;
mod int4_kernel;
pub mod mx;
pub mod mx_pairs;
pub mod outdir;
pub mod transform;
pub mod view;

pub use error::ModelError;

/// The index file name of a sharded Hugging Face model directory.
pub const INDEX_NAME: &str = "model.safetensors.index.json";
/// The single-file model of a model directory.
pub const SINGLE_NAME: &str = "model.safetensors";
/// The configuration file of a model directory.
pub const CONFIG_NAME: &str = "config.json";
/// The tokenizer file of a model directory.
pub const TOKENIZER_NAME: &str = "tokenizer.json";
/// Largest `config.json` read (real ones are a few KiB).
pub const MAX_CONFIG_SIZE: u64 = 16 << 20;

/// What the model argument was.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// One safetensors file.
    File,
    /// A sharded index file.
    Index,
    /// A model directory.
    Directory,
}

/// One safetensors file of the model.
#[derive(Debug, Clone)]
pub struct Shard {
    /// Its file name (as the index names it, or the file's own name).
    pub name: String,
    /// Where it is read from.
    pub path: PathBuf,
    /// Its validated header.
    pub header: Header,
}

/// One physical tensor and the shard holding it.
#[derive(Debug, Clone)]
pub struct Entry {
    /// Index into [`Model::shards`].
    pub shard: usize,
    /// The tensor.
    pub info: TensorInfo,
}

/// How a logical tensor is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Storage {
    /// One tensor (index into [`Model::entries`]).
    Plain(usize),
    /// An int4 pair: the `.qweight` and `.scales` entries and the group size.
    Int4 {
        /// The `.qweight` entry.
        qweight: usize,
        /// The `.scales` entry.
        scales: usize,
        /// Group size G.
        group: u64,
    },
    /// An MX pair: the elements entry (`_blocks` or F8_E4M3 `.weight`), the E8M0
    /// scales entry and the element format.
    Mx {
        /// The elements entry.
        elems: usize,
        /// The scales entry.
        scales: usize,
        /// The element format.
        fmt: mx::MxFormat,
    },
}

impl Storage {
    /// The entry a logical tensor is found at first (its elements for a pair).
    pub fn first_entry(&self) -> usize {
        match *self {
            Storage::Plain(i) => i,
            Storage::Int4 { qweight, .. } => qweight,
            Storage::Mx { elems, .. } => elems,
        }
    }

    /// The entries of a pair (none for a plain tensor).
    pub fn pair(&self) -> Option<[usize; 2]> {
        match *self {
            Storage::Plain(_) => None,
            Storage::Int4 {
                qweight, scales, ..
            } => Some([qweight, scales]),
            Storage::Mx { elems, scales, .. } => Some([elems, scales]),
        }
    }
}

/// A tensor as the model means it.
#[derive(Debug, Clone)]
pub struct Logical {
    /// Its name (`<name>` for an int4 pair).
    pub name: String,
    /// Its logical shape (`[out, in]` for an int4 pair).
    pub shape: Vec<u64>,
    /// How it is stored.
    pub storage: Storage,
}

/// An opened model: its files, its tensors and its configuration.
#[derive(Debug, Clone)]
pub struct Model {
    /// The argument as given.
    pub path: PathBuf,
    /// What it was.
    pub kind: Kind,
    /// The index file, for a sharded model.
    pub index_path: Option<PathBuf>,
    /// The index's `metadata` object (empty for unsharded models).
    pub index_metadata: BTreeMap<String, serde_json::Value>,
    /// The directory of `config.json` and the other files (directories and indexes).
    pub dir: Option<PathBuf>,
    /// `config.json`, when present and an object.
    pub config: Option<serde_json::Map<String, serde_json::Value>>,
    /// The safetensors files in name order.
    pub shards: Vec<Shard>,
    /// Every physical tensor once, by name.
    pub entries: Vec<Entry>,
    /// Logical tensors by name.
    pub logical: Vec<Logical>,
    /// The `quant` value shared by the shards (int4 and MX models).
    pub quant: Option<String>,
}

impl Model {
    /// Open `path` (a file, an index or a directory), failing on the first broken rule
    /// (exit 1) or an unreadable path (exit 2).
    pub fn open(path: &Path) -> Result<Model, ModelError> {
        let (model, problems) = Model::scan(path)?;
        Model::first_problem(model, problems)
    }

    /// Open `path` and list every broken rule (index, reader, int4, architecture,
    /// tokenizer) found from the headers and JSON files; an error only when nothing can
    /// be read at all.
    pub fn scan(path: &Path) -> Result<(Model, Findings), ModelError> {
        Model::scan_with(path, &files::LocalFiles)
    }

    /// [`Model::scan`] reading through `files` (a prefix in object storage, for one).
    pub fn scan_with(
        path: &Path,
        files: &dyn files::ModelFiles,
    ) -> Result<(Model, Findings), ModelError> {
        let io = |source| ModelError::Io {
            path: path.to_path_buf(),
            source,
        };
        let is_dir = files.is_dir(path).map_err(io)?;
        let mut problems = Findings::new();
        let Located {
            kind,
            index_path,
            single,
            dir,
        } = Located::of(path, is_dir, files)?;

        let mut shards = Vec::new();
        let mut index_metadata = BTreeMap::new();
        let mut weight_map = None;
        let before = problems.len();
        if let Some(index_path) = &index_path {
            let parsed = index::read(index_path, files, &mut problems)?;
            if let Some(parsed) = parsed {
                index_metadata = parsed.metadata;
                shards = parsed.shards;
                weight_map = Some(parsed.weight_map);
            }
        } else if let Some(single) = &single {
            let name = single
                .file_name()
                .map_or_else(|| SINGLE_NAME.to_string(), |n| n.to_string_lossy().into());
            match files.read_header(single) {
                Ok(header) => shards.push(Shard {
                    name,
                    path: single.clone(),
                    header,
                }),
                Err(e) => match e.rule() {
                    Some(rule) => problems.push(Finding {
                        rule: rule.to_string(),
                        tensor: e.tensor().map(str::to_string),
                        message: e.to_string(),
                    }),
                    None => return Err(ModelError::Safetensors(e)),
                },
            }
        }

        // total_size is only meaningful when every shard could be read.
        let complete = problems.len() == before;
        let config = match &dir {
            Some(d) => read_config(&d.join(CONFIG_NAME), files, &mut problems)?,
            None => None,
        };
        let located = Located {
            kind,
            index_path,
            single: None,
            dir,
        };
        let model = Model::assemble(
            path,
            located,
            shards,
            index_metadata,
            weight_map,
            config,
            complete,
            files,
            &mut problems,
        );
        Ok((model, problems))
    }

    /// A single safetensors file whose header was read elsewhere (a range request of
    /// an object in storage): `path` names it, and the checks are `open`'s.
    pub fn from_header(path: &Path, header: Header) -> Result<Model, ModelError> {
        let (model, problems) = Model::header_findings(path, header);
        Model::first_problem(model, problems)
    }

    /// [`Model::from_header`]'s model with every rule it breaks as a finding (what
    /// `st verify` reports of one file it did not read locally).
    pub fn header_findings(path: &Path, header: Header) -> (Model, Findings) {
        let name = path
            .file_name()
            .map_or_else(|| SINGLE_NAME.to_string(), |n| n.to_string_lossy().into());
        let shards = vec![Shard {
            name,
            path: path.to_path_buf(),
            header,
        }];
        let located = Located {
            kind: Kind::File,
            index_path: None,
            single: None,
            dir: None,
        };
        let mut problems = Findings::new();
        let model = Model::assemble(
            path,
            located,
            shards,
            BTreeMap::new(),
            None,
            None,
            true,
            &files::LocalFiles,
            &mut problems,
        );
        (model, problems)
    }

    /// The model, or its first broken rule with how many more there are.
    pub(crate) fn first_problem(model: Model, problems: Findings) -> Result<Model, ModelError> {
        let total = problems.len();
        let (kept, _) = problems.into_parts();
        match kept.into_iter().next() {
            None => Ok(model),
            Some(first) => Err(ModelError::Invalid {
                first: first.message,
                more: usize::try_from(total.saturating_sub(1)).unwrap_or(usize::MAX),
            }),
        }
    }

    /// The checks shared by every way of opening: entries, int4, names, tokenizer.
    #[allow(
        clippy::too_many_arguments,
        reason = "the parts `scan` and `from_header` each gather, handed over once"
    )]
    fn assemble(
        path: &Path,
        located: Located,
        shards: Vec<Shard>,
        index_metadata: BTreeMap<String, serde_json::Value>,
        weight_map: Option<BTreeMap<String, String>>,
        config: Option<serde_json::Map<String, serde_json::Value>>,
        complete: bool,
        files: &dyn files::ModelFiles,
        problems: &mut Findings,
    ) -> Model {
        let Located {
            kind,
            index_path,
            dir,
            ..
        } = located;
        let entries = index::entries(&shards, weight_map.as_ref(), problems);
        // gpt-oss's own shards carry no `quant`: its config's quantization_config says
        // MXFP4 instead.
        let quant =
            int4::quant_of(&shards, problems).or_else(|| mx_pairs::config_quant(config.as_ref()));
        let logical = int4::logical(&entries, quant.as_deref(), problems);
        let mut model = Model {
            path: path.to_path_buf(),
            kind,
            index_path,
            index_metadata,
            dir,
            config,
            shards,
            entries,
            logical,
            quant,
        };
        if let (Some(total), true) = (model.index_metadata.get("total_size"), complete) {
            index::check_total_size(total, &model, problems);
        }
        // Names are only worth checking when every file could be read.
        if complete {
            arch::check(&model, problems);
        }
        if model.kind == Kind::Directory {
            check_tokenizer(&model, files, problems);
        }
        model.logical.sort_by(|a, b| a.name.cmp(&b.name));
        model
    }

    /// The logical tensor of that name.
    pub fn logical(&self, name: &str) -> Option<&Logical> {
        self.logical
            .binary_search_by(|l| l.name.as_str().cmp(name))
            .ok()
            .and_then(|i| self.logical.get(i))
    }

    /// The entry at index `i`.
    pub fn entry(&self, i: usize) -> Option<&Entry> {
        self.entries.get(i)
    }

    /// The sum of every tensor's byte length (what `total_size` must say).
    pub fn data_bytes(&self) -> u64 {
        self.entries
            .iter()
            .fold(0u64, |acc, e| acc.saturating_add(e.info.byte_len()))
    }

    /// True when the model has several files or an index (its output is a directory).
    pub fn is_dir_like(&self) -> bool {
        self.kind != Kind::File
    }

    /// The dtype and byte count of a logical tensor as stored.
    pub fn stored(&self, l: &Logical) -> (String, u64) {
        match l.storage {
            Storage::Plain(i) => self.entry(i).map_or((String::new(), 0), |e| {
                (e.info.dtype.to_string(), e.info.byte_len())
            }),
            Storage::Int4 {
                qweight,
                scales,
                group,
            } => {
                let bytes = [qweight, scales]
                    .iter()
                    .filter_map(|&i| self.entry(i))
                    .fold(0u64, |acc, e| acc.saturating_add(e.info.byte_len()));
                (int4::quant_name(group), bytes)
            }
            Storage::Mx { elems, scales, fmt } => {
                let bytes = [elems, scales]
                    .iter()
                    .filter_map(|&i| self.entry(i))
                    .fold(0u64, |acc, e| acc.saturating_add(e.info.byte_len()));
                (fmt.quant_name().to_string(), bytes)
            }
        }
    }

    /// The shard holding a logical tensor (its `.qweight` for an int4 pair).
    pub fn shard_of(&self, l: &Logical) -> Option<&Shard> {
        self.entry(l.storage.first_entry())
            .and_then(|e| self.shards.get(e.shard))
    }

    /// Parameter count of every logical tensor.
    pub fn params(&self) -> u64 {
        self.logical.iter().fold(0u64, |acc, l| {
            acc.saturating_add(crate::safetensors::dtype::numel(&l.shape).unwrap_or(0))
        })
    }

    /// Bytes by stored dtype name, for the dtype mix.
    pub fn dtype_mix(&self) -> BTreeMap<String, u64> {
        let mut mix: BTreeMap<String, u64> = BTreeMap::new();
        for l in &self.logical {
            let (d, bytes) = self.stored(l);
            let e = mix.entry(d).or_default();
            *e = e.saturating_add(bytes);
        }
        mix
    }
}

/// Where a model argument's files are.
struct Located {
    kind: Kind,
    index_path: Option<PathBuf>,
    single: Option<PathBuf>,
    dir: Option<PathBuf>,
}

impl Located {
    /// What `path` (a directory when `is_dir`) is: a directory, an index or a file.
    fn of(path: &Path, is_dir: bool, files: &dyn files::ModelFiles) -> Result<Located, ModelError> {
        let (kind, index_path, single, dir) = if is_dir {
            let index = path.join(INDEX_NAME);
            let single = path.join(SINGLE_NAME);
            let (has_index, has_single) = (files.exists(&index), files.exists(&single));
            if has_index && has_single {
                return Err(ModelError::Ambiguous(path.to_path_buf()));
            } else if has_index {
                (Kind::Directory, Some(index), None, Some(path.to_path_buf()))
            } else if has_single {
                (
                    Kind::Directory,
                    None,
                    Some(single),
                    Some(path.to_path_buf()),
                )
            } else {
                return Err(ModelError::NotAModel {
                    path: path.to_path_buf(),
                });
            }
        } else if path.to_string_lossy().ends_with(".json") {
            (
                Kind::Index,
                Some(path.to_path_buf()),
                None,
                Some(parent(path)),
            )
        } else {
            (Kind::File, None, Some(path.to_path_buf()), None)
        };
        Ok(Located {
            kind,
            index_path,
            single,
            dir,
        })
    }
}

/// The directory holding `path` (`.` for a bare file name).
pub fn parent(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// A finding of rule `rule` about `tensor`.
pub(crate) fn finding(rule: &str, tensor: Option<&str>, message: String) -> Finding {
    Finding {
        rule: rule.to_string(),
        tensor: tensor.map(str::to_string),
        message,
    }
}

/// The torch name of a float dtype (what `config.json`'s `torch_dtype` says).
pub fn torch_name(d: Dtype) -> Option<&'static str> {
    Some(match d {
        Dtype::F32 => "float32",
        Dtype::BF16 => "bfloat16",
        Dtype::F16 => "float16",
        Dtype::F64 => "float64",
        Dtype::F8_E4M3 => "float8_e4m3fn",
        Dtype::F8_E5M2 => "float8_e5m2",
        _ => return None,
    })
}

#[cfg(test)]
mod mx_model_tests;
#[cfg(test)]
mod mx_quant_tests;
#[cfg(test)]
mod tests;
