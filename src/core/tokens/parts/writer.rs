//! Running a part: its ids written as a raw little-endian stream in the shards' dtype
//! (hashed as they go), then its marker; a part already complete with the same
//! identity is left as it is.

use std::io::Write;
use std::path::{Path, PathBuf};

use super::marker::{
    check_count, complete_marker, layout_name, mtime_ns, plan_fields, write_marker, InputId,
    PartIdentity, PartMarker,
};
use super::plan::{
    compressed, is_newline, is_space, part_segments, plan_cuts, scan_boundary, Position, Segment,
    Split,
};
use super::{io_err, part_area, Part, PartsError, IDS_FILE, MARKER_FORMAT, MARKER_VERSION};
use crate::atomic::AtomicFile;
use crate::tokens::corpus::{
    check_text_options, open_range, range_name, tokenize_sources, Source, TextPackOptions,
    TextPackProgress,
};
use crate::tokens::pack::{
    pack_input, IdSink, InputFormat, PackInput, PackOptions, ShardPlan, READ_CHUNK,
};
use crate::tokens::part_docs::{PartDocs, DOCS_FILE};
use crate::tokens::shard::{IdDtype, Layout, ShardHeader};
use crate::tokens::tokenizer::Tokenizer;
use crate::tokens::{CorpusFormat, TokensError};

/// What a part packs with.
#[derive(Clone)]
pub enum PartSource<'a> {
    /// Documents through a tokenizer (`opts.plan` names the final shards).
    Text {
        /// The tokenizer.
        tokenizer: &'a Tokenizer,
        /// Its [`tokenizer_identity`].
        identity: String,
        /// The pack's options.
        opts: &'a TextPackOptions,
    },
    /// Ids: bytes, decimal text or raw arrays.
    Ids {
        /// The pack's options.
        opts: &'a PackOptions,
    },
}

/// One part of a pack.
pub struct PartJob<'a> {
    /// The pack's output (the part area is `OUT.parts`).
    pub out: &'a Path,
    /// Every input of the whole pack, in order.
    pub inputs: &'a [PathBuf],
    /// Which part.
    pub part: Part,
    /// How to pack.
    pub source: PartSource<'a>,
}

/// What running a part did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PartOutcome {
    /// The part was complete already (same inputs and options): nothing was done.
    AlreadyComplete(PartMarker),
    /// The part was packed now.
    Packed(PartMarker),
}

impl PartJob<'_> {
    fn vocab(&self) -> u32 {
        match &self.source {
            PartSource::Text { tokenizer, .. } => tokenizer.vocab_size(),
            PartSource::Ids { opts } => opts.vocab,
        }
    }

    fn layout(&self) -> Layout {
        match &self.source {
            PartSource::Text { opts, .. } => opts.layout,
            PartSource::Ids { opts } => opts.layout,
        }
    }

    fn plan(&self) -> ShardPlan {
        match &self.source {
            PartSource::Text { opts, .. } => opts.plan.clone(),
            PartSource::Ids { opts } => match opts.shard_tokens {
                Some(shard_tokens) => ShardPlan::Numbered {
                    out: self.out.to_path_buf(),
                    shard_tokens,
                },
                None => ShardPlan::Single(self.out.to_path_buf()),
            },
        }
    }

    fn identity(&self, stats: &[(u64, i64)]) -> PartIdentity {
        let vocab = self.vocab();
        let (shards, shard_tokens, val_tokens) = plan_fields(&self.plan());
        let (format, tokenizer, field, eot, skip_bad) = match &self.source {
            PartSource::Text { identity, opts, .. } => (
                match opts.format {
                    CorpusFormat::Text => "text",
                    CorpusFormat::Jsonl => "jsonl",
                    CorpusFormat::Parquet => "parquet",
                },
                Some(identity.clone()),
                // Text files have no field.
                (opts.format != CorpusFormat::Text).then(|| opts.field.clone()),
                opts.eot,
                opts.skip_bad,
            ),
            PartSource::Ids { opts } => (
                match opts.format {
                    InputFormat::Bytes => "bytes",
                    InputFormat::Ids => "ids",
                    InputFormat::U16le => "u16le",
                    InputFormat::U32le => "u32le",
                },
                None,
                None,
                None,
                false,
            ),
        };
        PartIdentity {
            parts: self.part.count,
            format: format.to_string(),
            tokenizer,
            field,
            eot,
            skip_bad,
            vocab_size: vocab,
            layout: layout_name(vocab, self.layout()).to_string(),
            shards: shards.to_string(),
            shard_tokens,
            val_tokens,
            inputs: self
                .inputs
                .iter()
                .zip(stats)
                .map(|(p, &(size, mtime_ns))| InputId {
                    path: p.display().to_string(),
                    size,
                    mtime_ns,
                })
                .collect(),
        }
    }

    /// Check the job (before anything is read or written), then its inputs' sizes and
    /// the identity a part of it records.
    pub(crate) fn checked_identity(&self) -> Result<(Vec<u64>, PartIdentity), PartsError> {
        let stats = check_job(self)?;
        let identity = self.identity(&stats);
        Ok((stats.iter().map(|&(size, _)| size).collect(), identity))
    }

    fn split(&self, path: &Path) -> Split {
        match &self.source {
            PartSource::Text { opts, .. } => match opts.format {
                CorpusFormat::Jsonl if !compressed(path) => Split::After(is_newline),
                _ => Split::Whole,
            },
            PartSource::Ids { opts } => match opts.format {
                InputFormat::Bytes => Split::Every(1),
                InputFormat::U16le => Split::Every(2),
                InputFormat::U32le => Split::Every(4),
                InputFormat::Ids => Split::After(is_space),
            },
        }
    }
}

/// Writes a part's ids as a raw little-endian stream in the shards' dtype, hashing
/// them as they go.
struct PartWriter {
    file: AtomicFile,
    path: PathBuf,
    vocab: u32,
    dtype: IdDtype,
    count: u64,
    hasher: blake3::Hasher,
    buf: Vec<u8>,
    /// The document starts, for a tokenized pack.
    docs: Option<PartDocs>,
}

impl PartWriter {
    fn create(path: &Path, vocab: u32, layout: Layout) -> Result<PartWriter, PartsError> {
        let dtype = ShardHeader::for_layout(0, vocab, layout)?.dtype;
        Ok(PartWriter {
            file: AtomicFile::create(path)?,
            path: path.to_path_buf(),
            vocab,
            dtype,
            count: 0,
            hasher: blake3::Hasher::new(),
            buf: Vec::new(),
            docs: None,
        })
    }

    /// Make the ids (and document starts) durable under their final names; returns
    /// the count, bytes, digest and document starts.
    fn finish(self) -> Result<(u64, u64, String, Option<u64>), PartsError> {
        let bytes = self.count.saturating_mul(self.dtype.itemsize() as u64);
        let digest = self.hasher.finalize().to_hex().to_string();
        self.file.commit()?;
        let docs = self.docs.map(PartDocs::finish).transpose()?;
        Ok((self.count, bytes, digest, docs))
    }
}

impl IdSink for PartWriter {
    fn vocab(&self) -> u32 {
        self.vocab
    }

    fn push(&mut self, ids: &[u32]) -> Result<(), TokensError> {
        if let Some((index, &id)) = ids.iter().enumerate().find(|(_, &id)| id >= self.vocab) {
            return Err(TokensError::IdOutOfVocab {
                path: self.path.clone(),
                index: self.count.saturating_add(index as u64),
                id: u64::from(id),
                vocab: self.vocab,
            });
        }
        if let (Some(docs), false) = (&mut self.docs, ids.is_empty()) {
            docs.before_push(self.count)?;
        }
        self.buf.clear();
        match self.dtype {
            // Below vocab <= 65536 (checked above), so each fits u16.
            IdDtype::U16 => self
                .buf
                .extend(ids.iter().flat_map(|&id| (id as u16).to_le_bytes())),
            IdDtype::U32 => self.buf.extend(ids.iter().flat_map(|&id| id.to_le_bytes())),
        }
        self.hasher.update(&self.buf);
        self.file
            .write_all(&self.buf)
            .map_err(|error| TokensError::Io {
                path: self.path.clone(),
                error,
            })?;
        self.count = self.count.saturating_add(ids.len() as u64);
        Ok(())
    }

    fn tokens(&self) -> u64 {
        self.count
    }

    fn start_document(&mut self) {
        if let Some(docs) = &mut self.docs {
            docs.start();
        }
    }
}

/// Check a part job before anything is read or written; returns each input's size
/// and modification time.
fn check_job(job: &PartJob<'_>) -> Result<Vec<(u64, i64)>, PartsError> {
    if job.inputs.is_empty() || job.inputs.iter().any(|p| p.as_os_str() == "-") {
        return Err(PartsError::Stdin);
    }
    crate::tokens::pack::refuse_url_inputs(job.inputs.iter().map(PathBuf::as_path))?;
    if let PartSource::Text {
        tokenizer, opts, ..
    } = &job.source
    {
        check_text_options(tokenizer, opts)?;
    }
    let plan = job.plan();
    plan.check()?;
    plan.refuse_inputs(job.inputs.iter().map(PathBuf::as_path))?;
    let mut stats = Vec::with_capacity(job.inputs.len());
    for path in job.inputs {
        let file = crate::files::open_regular(path).map_err(io_err(path))?;
        let meta = file.metadata().map_err(io_err(path))?;
        stats.push((meta.len(), mtime_ns(path, &meta)?));
    }
    check_count(&part_area(job.out), job.part.count)?;
    Ok(stats)
}

/// The document sources of a part's segments: whole files, or line ranges.
fn text_sources(inputs: &[PathBuf], sizes: &[u64], segments: &[Segment]) -> Vec<Source> {
    segments
        .iter()
        .filter_map(|s| {
            let path = inputs.get(s.input)?.clone();
            let whole = s.start == 0 && Some(&s.end) == sizes.get(s.input);
            Some(if whole {
                Source::Whole(path)
            } else {
                Source::Lines {
                    path,
                    start: s.start,
                    end: s.end,
                }
            })
        })
        .collect()
}

/// Pack part `job.part` of the inputs into the part area of `job.out`: its ids, then
/// its marker, last. A part already complete with the same inputs and options is left
/// as it is ([`PartOutcome::AlreadyComplete`]); one without a marker (killed, never
/// run) is packed from scratch; one complete with other inputs or options is refused,
/// naming the difference. `progress` gets the running totals.
pub fn pack_part(
    job: &PartJob<'_>,
    progress: &mut dyn FnMut(&TextPackProgress),
) -> Result<PartOutcome, PartsError> {
    let (sizes, identity) = job.checked_identity()?;
    let dir = part_area(job.out).join(job.part.dir_name());
    if let Some(marker) = complete_marker(&dir, &identity)? {
        return Ok(PartOutcome::AlreadyComplete(marker));
    }
    let cuts = plan_cuts(&sizes, job.part.count, &mut |i, offset| {
        let path = job.inputs.get(i).map_or(Path::new(""), PathBuf::as_path);
        match job.split(path) {
            Split::Whole => Ok(None),
            Split::Every(n) => Ok(Some(offset.div_ceil(n).saturating_mul(n))),
            Split::After(is_end) => scan_boundary(path, offset, is_end).map(Some),
        }
    })?;
    // plan_cuts returns N + 1 cuts and K < N.
    let cut = |i: usize| {
        cuts.get(i).copied().unwrap_or(Position {
            input: sizes.len(),
            offset: 0,
        })
    };
    let (start, end) = (cut(job.part.index), cut(job.part.index.saturating_add(1)));
    let segments = part_segments(&sizes, start, end);
    crate::files::create_dir_all(&dir).map_err(io_err(&dir))?;
    let ids_path = dir.join(IDS_FILE);
    let mut writer = PartWriter::create(&ids_path, job.vocab(), job.layout())?;
    let (documents, skipped) = match &job.source {
        PartSource::Text {
            tokenizer, opts, ..
        } => {
            let sources = text_sources(job.inputs, &sizes, &segments);
            writer.docs = Some(PartDocs::create(&dir.join(DOCS_FILE))?);
            tokenize_sources(&sources, tokenizer, opts, &mut writer, progress)?
        }
        PartSource::Ids { opts } => {
            pack_id_segments(job.inputs, &segments, opts.format, &mut writer, progress)?;
            (0, 0)
        }
    };
    let (tokens, bytes, blake3, doc_starts) = writer.finish()?;
    let marker = PartMarker {
        format: MARKER_FORMAT.to_string(),
        version: MARKER_VERSION,
        part: job.part.index,
        identity,
        start,
        end,
        documents,
        skipped,
        tokens,
        bytes,
        blake3,
        doc_starts,
    };
    write_marker(&dir, &marker)?;
    Ok(PartOutcome::Packed(marker))
}

/// Pack the id segments into `sink`, each read by seeking to its start.
fn pack_id_segments(
    inputs: &[PathBuf],
    segments: &[Segment],
    format: InputFormat,
    sink: &mut PartWriter,
    progress: &mut dyn FnMut(&TextPackProgress),
) -> Result<(), PartsError> {
    let mut buf = vec![0u8; READ_CHUNK];
    let mut ids = Vec::with_capacity(READ_CHUNK);
    let mut totals = TextPackProgress::default();
    for segment in segments {
        let Some(path) = inputs.get(segment.input) else {
            continue;
        };
        let name = if segment.start == 0 {
            path.display().to_string()
        } else {
            range_name(path, segment.start)
        };
        let mut input = PackInput {
            name,
            reader: Box::new(open_range(path, segment.start, segment.end)?),
            path: Some(path.clone()),
        };
        pack_input(&mut input, sink, format, &mut buf, &mut ids, &mut |n| {
            totals.bytes = totals.bytes.saturating_add(n);
        })?;
        totals.tokens = sink.tokens();
        progress(&totals);
    }
    Ok(())
}
