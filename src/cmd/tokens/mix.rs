//! The flags of a mixture (`--mix SRC:W`, `--stage B:W,...`, `--allow-new-mixture`)
//! of `tokens windows`, turned into core's sources and stages by the rules Python's
//! `TokenStream(sources=, stages=)` applies; and the report of `tokens windows --mix --report` (core's
//! `Mixture::report`) printed.
//!
//! Invariants: a flag that cannot be read is an error naming it before any shard is
//! opened; every rule on the weights' values (finite, > 0, summing to 1) is core's.

use super::*;
use tlio_core::remote::NamedSource;
use tlio_core::tokens::{MixReport, Mixture, MixtureOptions, Stage};

/// The flags of a mixture of sources.
#[derive(Debug, Args, Clone, Default)]
pub struct MixArgs {
    /// A source of a mixture and its weight, SRC:W (repeated, in the sources' order):
    /// SRC is a shard, a `*` pattern in its last segment (`web/*.bin`), a pack's
    /// manifest or an s3:// URL. Weights are finite, above 0 and sum to 1 (within
    /// 1e-6). With --stage the weights may be left out (SRC alone).
    #[arg(long = "mix", value_name = "SRC:W")]
    pub mix: Vec<String>,
    /// A stage of the weights, B:W1,W2,... (repeated, the first at global batch 0,
    /// increasing): from global batch B on, windows follow these weights, one per
    /// --mix source. Weights given in --mix must equal the first stage's.
    #[arg(long = "stage", value_name = "B:W,...")]
    pub stages: Vec<String>,
    /// Accept a --cursor of another mixture (other shards or weights) on purpose: each
    /// source resumes where it was, and this mixture's weights start a new stage at
    /// the next global batch.
    #[arg(long)]
    pub allow_new_mixture: bool,
}

impl MixArgs {
    /// Whether the flags name a mixture.
    pub fn is_mixture(&self) -> bool {
        !self.mix.is_empty()
    }

    /// Refuse a mixture's flag (`--stage`, `--allow-new-mixture`, or `other`, set by
    /// the command) without `--mix`, which it would silently not apply to.
    pub fn check_alone(&self, other: Option<&str>) -> anyhow::Result<()> {
        if self.is_mixture() {
            return Ok(());
        }
        let given = [
            (!self.stages.is_empty()).then_some("--stage"),
            self.allow_new_mixture.then_some("--allow-new-mixture"),
            other,
        ];
        match given.into_iter().flatten().next() {
            Some(flag) => Err(operational(format!(
                "{flag} applies to a mixture: give its sources with --mix SRC:W"
            ))),
            None => Ok(()),
        }
    }
}

/// `--mix SRC:W` as the source and its weight, or the source alone when the text after
/// the last `:` is no number (`s3://bucket/x.bin`, a path with a colon).
fn source_flag(text: &str) -> (String, Option<f64>) {
    match text.rsplit_once(':') {
        Some((src, w)) if !src.is_empty() => match w.trim().parse::<f64>() {
            Ok(weight) => (src.to_string(), Some(weight)),
            Err(_) => (text.to_string(), None),
        },
        _ => (text.to_string(), None),
    }
}

/// `--stage B:W1,W2,...`.
fn stage_flag(text: &str) -> anyhow::Result<Stage> {
    let bad = |why: &str| operational(format!("--stage {text}: {why}; expected B:W1,W2,..."));
    let (b, ws) = text.split_once(':').ok_or_else(|| bad("no ':'"))?;
    let batch = b
        .trim()
        .parse::<u64>()
        .map_err(|_| bad(&format!("the global batch {b:?} is not a whole number")))?;
    let weights = ws
        .split(',')
        .map(|w| {
            w.trim()
                .parse::<f64>()
                .map_err(|_| bad(&format!("the weight {w:?} is not a number")))
        })
        .collect::<anyhow::Result<Vec<f64>>>()?;
    Ok(Stage { batch, weights })
}

/// The sources and stages the flags name (the weights' values are checked by core).
pub fn mixture_plan(args: &MixArgs) -> anyhow::Result<(Vec<NamedSource>, Vec<Stage>)> {
    let mut sources = Vec::with_capacity(args.mix.len());
    let mut weights = Vec::with_capacity(args.mix.len());
    for text in &args.mix {
        let (src, weight) = source_flag(text);
        if src.is_empty() {
            return Err(operational("--mix needs a source: SRC:W"));
        }
        weights.push(weight);
        sources.push((src.clone(), vec![PathBuf::from(src)]));
    }
    let stages = args
        .stages
        .iter()
        .map(|s| stage_flag(s))
        .collect::<anyhow::Result<Vec<Stage>>>()?;
    let given: Vec<f64> = weights.iter().flatten().copied().collect();
    if stages.is_empty() {
        if let Some(at) = weights.iter().position(Option::is_none) {
            return Err(operational(format!(
                "--mix {}: a source needs a weight, SRC:W (or give every weight with --stage)",
                args.mix.get(at).map_or("", String::as_str)
            )));
        }
        return Ok((
            sources,
            vec![Stage {
                batch: 0,
                weights: given,
            }],
        ));
    }
    let first = stages
        .first()
        .map(|s| s.weights.clone())
        .unwrap_or_default();
    if !given.is_empty() && (given.len() != weights.len() || given != first) {
        let show = |ws: &[f64]| {
            ws.iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        };
        return Err(operational(format!(
            "the --mix weights [{}] differ from the first --stage's [{}]: give the weights in one place",
            show(&given),
            show(&first)
        )));
    }
    Ok((sources, stages))
}

/// The mixture the flags name, opened by one core call.
pub fn open_mixture(
    args: &MixArgs,
    (seq_len, batch): (usize, usize),
    rng: Pcg32,
    vocab: Option<u32>,
    options: MixtureOptions,
) -> anyhow::Result<Mixture> {
    let (sources, stages) = mixture_plan(args)?;
    Ok(tlio_core::remote::open_mixture(
        &sources,
        &stages,
        (seq_len, batch),
        rng,
        vocab,
        options,
    )?)
}

/// One source's row of `tokens windows --mix --report`.
#[derive(Serialize)]
struct SourceRow<'a> {
    source: usize,
    name: &'a str,
    windows: u64,
    share: f64,
    expected: f64,
    worst_batch_gap: f64,
    passes: u64,
    epochs: u64,
}

/// `tokens mix-report --json`.
#[derive(Serialize)]
struct ReportLine<'a> {
    batches: u64,
    global_batch: usize,
    windows: u64,
    sources: Vec<SourceRow<'a>>,
}

/// Print `tokens windows --mix --report`: the report of the mixture's next `batches`
/// global batches (core's `Mixture::report`, which moves the mixture past them).
pub(super) fn print_report(
    mixture: &mut Mixture,
    batches: u64,
    printer: &Printer,
) -> anyhow::Result<()> {
    let report = mixture.report(batches, &mut || false)?;
    print_rows(mixture, &report, printer)
}

fn print_rows(mixture: &Mixture, report: &MixReport, printer: &Printer) -> anyhow::Result<()> {
    let total = report.windows.max(1) as f64;
    let rows: Vec<SourceRow<'_>> = report
        .sources
        .iter()
        .zip(mixture.names())
        .enumerate()
        .map(|(j, (s, name))| SourceRow {
            source: j,
            name,
            windows: s.windows,
            share: s.windows as f64 / total,
            expected: s.expected,
            worst_batch_gap: s.worst_batch_gap,
            passes: s.passes,
            epochs: s.epochs,
        })
        .collect();
    if printer.json {
        printer.json_line(&ReportLine {
            batches: report.batches,
            global_batch: mixture.global_batch(),
            windows: report.windows,
            sources: rows,
        })?;
        return Ok(());
    }
    let mut table = printer.table();
    table.set_header([
        "source",
        "windows",
        "share",
        "expected",
        "worst batch gap",
        "passes",
        "epochs",
    ]);
    for row in &rows {
        table.add_row(vec![
            comfy_table::Cell::new(escape(row.name)),
            comfy_table::Cell::new(row.windows),
            comfy_table::Cell::new(format!("{:.4}", row.share)),
            comfy_table::Cell::new(format!("{:.4}", row.expected)),
            comfy_table::Cell::new(format!("{:.2}", row.worst_batch_gap)),
            comfy_table::Cell::new(row.passes),
            comfy_table::Cell::new(row.epochs),
        ]);
    }
    let mut out = printer.out();
    writeln!(
        out,
        "{} global batch(es) of {} window(s):\n{}",
        report.batches,
        mixture.global_batch(),
        crate::output::table_text(&table)
    )?;
    out.flush()?;
    Ok(())
}
