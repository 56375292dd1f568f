//! The one output layer every command shares: results to stdout (human table or JSON),
//! chatter and progress to stderr, progress bars only on a terminal and never with
//! `--quiet` or `--json`. A [`Printer`] can be given any writers instead of the
//! process's streams ([`Printer::with_writers`]), so rendering is tested in-process.
//!
//! Invariant: nothing here panics on a closed pipe; every write returns `io::Result`
//! so that a broken pipe travels up to `error::report`, which exits 0 quietly. Colour
//! only where `--color` and the environment allow it, never in JSON; no rendered line
//! ends in whitespace.

use std::io::{self, IsTerminal, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use comfy_table::{presets, Cell, Color, ContentArrangement, Table};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::Serialize;

/// The `--color` choice.
#[allow(
    missing_docs,
    reason = "doc comments would become clap's value help; see below"
)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ColorChoice {
    // Plain comments, not doc comments: clap would list them under --help, where the
    // flag's own line already says what each value does.
    // On a terminal, unless NO_COLOR is set; CLICOLOR_FORCE forces it on.
    Auto,
    // Always colour.
    Always,
    // Never colour.
    Never,
}

impl ColorChoice {
    /// Whether a stream gets colour, given whether it is a terminal and the
    /// environment: `NO_COLOR` (any non-empty value) turns `auto` off,
    /// `CLICOLOR_FORCE` (non-empty, not `0`) turns `auto` on even when piped; an
    /// explicit `always`/`never` wins over both.
    pub fn enabled(self, is_tty: bool, env: impl Fn(&str) -> Option<String>) -> bool {
        let set = |name: &str| env(name).is_some_and(|v| !v.is_empty());
        match self {
            ColorChoice::Always => true,
            ColorChoice::Never => false,
            ColorChoice::Auto if set("NO_COLOR") => false,
            ColorChoice::Auto
                if set("CLICOLOR_FORCE") && env("CLICOLOR_FORCE").as_deref() != Some("0") =>
            {
                true
            }
            ColorChoice::Auto => is_tty,
        }
    }

    /// `enabled` with the process's environment.
    pub fn enabled_here(self, is_tty: bool) -> bool {
        self.enabled(is_tty, |name| std::env::var(name).ok())
    }
}

/// Whether `tlio: error:` on stderr is coloured; set once by `Printer::new`, read by
/// the error reporter, which has no printer. Before a command line is parsed (usage
/// errors) the reporter decides from the environment alone.
static STDERR_COLOR: AtomicBool = AtomicBool::new(false);
static STDERR_COLOR_SET: AtomicBool = AtomicBool::new(false);

/// Whether error lines on stderr get colour.
pub fn stderr_color() -> bool {
    if STDERR_COLOR_SET.load(Ordering::Relaxed) {
        STDERR_COLOR.load(Ordering::Relaxed)
    } else {
        ColorChoice::Auto.enabled_here(io::stderr().is_terminal())
    }
}

/// The colours of the words people scan for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tone {
    /// Success: pass, ok, yes.
    Good,
    /// Failure: FAIL, no, a problem.
    Bad,
}

impl Tone {
    fn ansi(self) -> &'static str {
        match self {
            Tone::Good => "\x1b[32m",
            Tone::Bad => "\x1b[1;31m",
        }
    }

    fn table_color(self) -> Color {
        match self {
            Tone::Good => Color::Green,
            Tone::Bad => Color::Red,
        }
    }
}

/// `text` wrapped in the ANSI colour of `tone` when `color`, else unchanged.
pub fn paint(text: &str, tone: Tone, color: bool) -> String {
    if color {
        format!("{}{text}\x1b[0m", tone.ansi())
    } else {
        text.to_string()
    }
}

/// A byte count for people: exact below 1 KiB (`512 B`), else three significant
/// digits in binary units (`1.50 KiB`, `20.0 GiB`, `117 MiB`). JSON keeps exact bytes.
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    scaled(n, 1024.0, &UNITS, " ")
}

/// A count for people (parameters, ids): exact below 1000, else three significant
/// digits with K, M, B, T (`124M`, `5.37B`). JSON keeps exact counts.
pub fn human_count(n: u64) -> String {
    const UNITS: [&str; 5] = ["K", "M", "B", "T", "Q"];
    if n < 1000 {
        return n.to_string();
    }
    scaled(n, 1000.0, &UNITS, "")
}

/// `n` divided by `base` until below `base`, shown with three significant digits and
/// the unit reached. Rounding can reach `base` itself (1023.9 KiB → "1024 KiB" would be
/// wrong), in which case the next unit is used.
fn scaled(n: u64, base: f64, units: &[&str], sep: &str) -> String {
    // u64 to f64 loses precision only beyond 2^53, far below what three digits show.
    let mut value = n as f64 / base;
    let mut unit = 0;
    loop {
        let digits = if value >= 99.95 {
            0
        } else if value >= 9.995 {
            1
        } else {
            2
        };
        let text = format!("{value:.digits$}");
        let rounded: f64 = text.parse().unwrap_or(value);
        if rounded >= base && unit + 1 < units.len() {
            value /= base;
            unit += 1;
            continue;
        }
        return format!("{text}{sep}{}", units.get(unit).copied().unwrap_or(""));
    }
}

/// Six significant digits, without trailing zeros: plain notation between 1e-4 and
/// 1e6 (`2.5`, `0.000123`, `1.11803`), scientific outside (`1e-8`, `3.38953e38`), so a
/// tiny value never shows as 0.000000 and a huge one never as 39 digits. JSON keeps
/// the full f64.
pub fn significant(x: f64) -> String {
    if x == 0.0 || !x.is_finite() {
        return format!("{x}");
    }
    let magnitude = x.abs();
    if (1e-4..1e6).contains(&magnitude) {
        // Digits after the point so that six significant digits show.
        let exponent = magnitude.log10().floor() as i32;
        let decimals = usize::try_from(5 - exponent).unwrap_or(0);
        let text = format!("{x:.decimals$}");
        if text.contains('.') {
            text.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            text
        }
    } else {
        let text = format!("{x:.5e}");
        match text.split_once('e') {
            Some((mantissa, exp)) => {
                let mantissa = if mantissa.contains('.') {
                    mantissa.trim_end_matches('0').trim_end_matches('.')
                } else {
                    mantissa
                };
                format!("{mantissa}e{exp}")
            }
            None => text,
        }
    }
}

/// A rendered table without the padding comfy-table leaves at the end of each row.
pub fn table_text(table: &Table) -> String {
    let text = table.to_string();
    let mut out = String::with_capacity(text.len());
    for (i, line) in text.lines().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        out.push_str(line.trim_end());
    }
    out
}

/// The width comfy-table gives `text` in a column: its display width, counted the way
/// the table library counts it (ASCII fast; anything else measured by the library
/// itself, after an `x` so that its "at least one column" rule cannot interfere).
pub fn display_width(text: &str) -> usize {
    if text.bytes().all(|b| (0x20..0x7f).contains(&b)) {
        return text.len();
    }
    let mut probe = Table::new();
    probe.add_row(vec![format!("x{text}")]);
    probe
        .column_max_content_widths()
        .first()
        .map_or(0, |&w| usize::from(w).saturating_sub(1))
}

/// A table in the piped (plain) form written a row at a time, so that a listing of a
/// million tensors never holds its rows: the caller measures every row, then writes
/// each. The bytes are those [`table_text`] gives for the same rows in a
/// [`Printer::table`] that is not on a terminal (no borders, one space of padding each
/// side, left-aligned, each line without trailing whitespace); cells must be single
/// lines (escaped text is) and narrower than 65,535 columns (cells are capped).
#[derive(Debug, Clone)]
pub struct PlainTable {
    widths: Vec<usize>,
}

impl PlainTable {
    /// A table with this header row (measured already).
    pub fn new(header: &[&str]) -> Self {
        let mut table = PlainTable {
            widths: vec![1; header.len()],
        };
        table.measure(header);
        table
    }

    /// Widen the columns to fit `row`.
    pub fn measure<S: AsRef<str>>(&mut self, row: &[S]) {
        for (w, text) in self.widths.iter_mut().zip(row) {
            *w = (*w).max(display_width(text.as_ref()));
        }
    }

    /// Write `row` as one line (the header row first, through [`PlainTable::write_header`]).
    pub fn write_row<S: AsRef<str>>(&self, out: &mut impl Write, row: &[S]) -> io::Result<()> {
        let mut line = String::new();
        for (w, text) in self.widths.iter().zip(row) {
            let text = text.as_ref();
            line.push(' ');
            line.push_str(text);
            let pad = w.saturating_sub(display_width(text)).saturating_add(1);
            line.extend(std::iter::repeat_n(' ', pad));
        }
        writeln!(out, "{}", line.trim_end())
    }

    /// Write the header row.
    pub fn write_header(&self, out: &mut impl Write, header: &[&str]) -> io::Result<()> {
        self.write_row(out, header)
    }
}

/// A writer a [`Printer`] shares between the places that print (`Write + Send`, so a
/// printer can be handed to worker threads).
type SharedWriter = Arc<Mutex<Box<dyn Write + Send>>>;

/// Where one stream of a printer goes: the process's own stream, or any writer (tests
/// render in-process into a buffer; a library caller can capture the output).
#[derive(Clone)]
enum Sink {
    /// The process's stdout or stderr.
    Process,
    /// A caller's writer (the in-process rendering tests).
    #[cfg_attr(
        not(test),
        expect(dead_code, reason = "only the in-process tests render into a writer")
    )]
    Writer(SharedWriter),
}

impl Sink {
    #[cfg(test)]
    fn of(writer: impl Write + Send + 'static) -> Self {
        let boxed: Box<dyn Write + Send> = Box::new(writer);
        Sink::Writer(Arc::new(Mutex::new(boxed)))
    }
}

/// The locked destination of results: stdout, or the printer's writer.
pub struct Out<'a>(OutLock<'a>);

enum OutLock<'a> {
    Stdout(io::StdoutLock<'static>),
    Writer(MutexGuard<'a, Box<dyn Write + Send>>),
}

impl Write for Out<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match &mut self.0 {
            OutLock::Stdout(w) => w.write(buf),
            OutLock::Writer(w) => w.write(buf),
        }
    }

    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        match &mut self.0 {
            OutLock::Stdout(w) => w.write_all(buf),
            OutLock::Writer(w) => w.write_all(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match &mut self.0 {
            OutLock::Stdout(w) => w.flush(),
            OutLock::Writer(w) => w.flush(),
        }
    }
}

/// A writer's lock; a writer poisoned by a panic elsewhere is still written to (the
/// bytes are only output, there is no invariant to protect).
fn lock(writer: &SharedWriter) -> MutexGuard<'_, Box<dyn Write + Send>> {
    writer
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Bytes a JSON document is buffered in before it reaches the writer.
const JSON_BUFFER: usize = 64 << 10;

/// Decides where and how a command's output goes.
#[derive(Clone)]
pub struct Printer {
    /// Print results as JSON instead of tables.
    pub json: bool,
    /// Silence progress and all non-error chatter.
    pub quiet: bool,
    /// Colour human output on stdout (never set with `--json`).
    pub color: bool,
    stderr_tty: bool,
    stdout_tty: bool,
    out: Sink,
    err: Sink,
}

impl std::fmt::Debug for Printer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = |s: &Sink| match s {
            Sink::Process => "process",
            Sink::Writer(_) => "writer",
        };
        f.debug_struct("Printer")
            .field("json", &self.json)
            .field("quiet", &self.quiet)
            .field("color", &self.color)
            .field("stderr_tty", &self.stderr_tty)
            .field("stdout_tty", &self.stdout_tty)
            .field("out", &name(&self.out))
            .field("err", &name(&self.err))
            .finish()
    }
}

impl Printer {
    /// A printer for the given global flags, looking at the real terminals and the
    /// environment.
    pub fn new(json: bool, quiet: bool, color: ColorChoice) -> Self {
        let stderr_tty = io::stderr().is_terminal();
        let stdout_tty = io::stdout().is_terminal();
        STDERR_COLOR.store(color.enabled_here(stderr_tty), Ordering::Relaxed);
        STDERR_COLOR_SET.store(true, Ordering::Relaxed);
        Printer {
            json,
            quiet,
            color: !json && color.enabled_here(stdout_tty),
            stderr_tty,
            stdout_tty,
            out: Sink::Process,
            err: Sink::Process,
        }
    }

    /// A printer that writes results to `out` and chatter to `err`, neither of them a
    /// terminal (so: plain tables, no progress bars), with colour exactly when `color`
    /// (and never with `json`). It looks at no terminal and no environment: the caller
    /// decides, as the command layer does for [`Printer::new`].
    #[cfg(test)]
    pub fn with_writers(
        json: bool,
        quiet: bool,
        color: bool,
        out: impl Write + Send + 'static,
        err: impl Write + Send + 'static,
    ) -> Self {
        Printer {
            json,
            quiet,
            color: !json && color,
            stderr_tty: false,
            stdout_tty: false,
            out: Sink::of(out),
            err: Sink::of(err),
        }
    }

    /// The same printer, told that its stdout is a terminal (box-drawn tables that fit
    /// its width), for rendering a terminal's view into a writer.
    #[cfg(test)]
    pub fn on_terminal(mut self, stdout_tty: bool) -> Self {
        self.stdout_tty = stdout_tty;
        self
    }

    /// Whether results go to a terminal (tables are box-drawn and fitted to it).
    pub fn stdout_is_terminal(&self) -> bool {
        self.stdout_tty
    }

    /// `text` in the colour of `tone` when stdout gets colour.
    pub fn paint(&self, text: &str, tone: Tone) -> String {
        paint(text, tone, self.color)
    }

    /// A table cell, in the colour of `tone` when stdout gets colour.
    pub fn cell(&self, text: impl Into<String>, tone: Tone) -> Cell {
        let cell = Cell::new(text.into());
        if self.color {
            cell.fg(tone.table_color())
        } else {
            cell
        }
    }

    /// The destination of results (standard output unless given a writer), locked.
    pub fn out(&self) -> Out<'_> {
        Out(match &self.out {
            Sink::Process => OutLock::Stdout(io::stdout().lock()),
            Sink::Writer(w) => OutLock::Writer(lock(w)),
        })
    }

    /// Write one line of chatter to the printer's stderr; failures are ignored (chatter
    /// must never turn a result into an error).
    fn chatter(&self, line: std::fmt::Arguments<'_>) {
        let _ = match &self.err {
            Sink::Process => writeln!(io::stderr().lock(), "{line}"),
            Sink::Writer(w) => writeln!(lock(w), "{line}"),
        };
    }

    /// Write one JSON document (compact, one line) to stdout.
    pub fn json_line<T: Serialize + ?Sized>(&self, value: &T) -> io::Result<()> {
        // Buffered: the encoder writes a token at a time, and a document may be a
        // whole 100 MB header's worth of tensors, serialized as it is walked.
        let mut out = io::BufWriter::with_capacity(JSON_BUFFER, self.out());
        // `io::Error::from` keeps the kind of an I/O failure (a broken pipe must stay
        // a broken pipe to end quietly); other serde errors become InvalidData.
        serde_json::to_writer(&mut out, value).map_err(io::Error::from)?;
        out.write_all(b"\n")?;
        out.flush()
    }

    /// A line of chatter on stderr, unless quiet.
    pub fn info(&self, line: impl AsRef<str>) {
        if !self.quiet {
            self.chatter(format_args!("{}", line.as_ref()));
        }
    }

    /// A warning on stderr; warnings are not errors, so `--quiet` silences them too.
    pub fn warn(&self, line: impl AsRef<str>) {
        if !self.quiet {
            // Warnings often carry names from files: never let them reach the terminal raw.
            self.chatter(format_args!(
                "tlio: warning: {}",
                tlio_core::text::escape(line.as_ref())
            ));
        }
    }

    /// Whether progress bars should be drawn (stderr is a terminal, not quiet, not JSON).
    pub fn wants_progress(&self) -> bool {
        self.stderr_tty && !self.quiet && !self.json
    }

    /// Whether plain progress lines (for logs) should be written when no bar is drawn.
    /// Never with `--json`: JSON output promises no progress at all (cli.md).
    pub fn wants_plain_progress(&self) -> bool {
        !self.stderr_tty && !self.quiet && !self.json
    }

    /// A byte-count progress bar, hidden unless `wants_progress`.
    pub fn bytes_bar(&self, total: u64, message: &str) -> ProgressBar {
        self.bar(
            total,
            message,
            "{msg} {bar:30} {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
        )
    }

    /// A count progress bar with a custom template, hidden unless `wants_progress`.
    pub fn bar(&self, total: u64, message: &str, template: &str) -> ProgressBar {
        if !self.wants_progress() {
            return ProgressBar::hidden();
        }
        let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
        if let Ok(style) = ProgressStyle::with_template(template) {
            bar.set_style(style);
        }
        bar.set_message(message.to_string());
        bar
    }

    /// A table styled for the destination: box drawing on a terminal, plain when piped.
    pub fn table(&self) -> Table {
        let mut table = Table::new();
        if self.stdout_tty {
            table
                .load_preset(presets::UTF8_FULL_CONDENSED)
                .set_content_arrangement(ContentArrangement::Dynamic);
        } else {
            table
                .load_preset(presets::NOTHING)
                .set_content_arrangement(ContentArrangement::Disabled);
        }
        if self.color {
            // comfy-table styles cells only on a terminal unless told otherwise; the
            // decision was already made by `--color` and the environment.
            table.enforce_styling();
        }
        table
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn color_choice_follows_flag_then_environment_then_terminal() {
        use super::ColorChoice::*;
        let none = |_: &str| None;
        let no_color = |n: &str| (n == "NO_COLOR").then(|| "1".to_string());
        let force = |n: &str| (n == "CLICOLOR_FORCE").then(|| "1".to_string());
        let force0 = |n: &str| (n == "CLICOLOR_FORCE").then(|| "0".to_string());
        let empty = |n: &str| (n == "NO_COLOR").then(String::new);
        assert!(Auto.enabled(true, none));
        assert!(!Auto.enabled(false, none));
        assert!(!Auto.enabled(true, no_color));
        assert!(Auto.enabled(true, empty));
        assert!(Auto.enabled(false, force));
        assert!(!Auto.enabled(false, force0));
        assert!(Always.enabled(false, no_color));
        assert!(!Never.enabled(true, force));
    }

    #[test]
    fn human_units() {
        use super::{human_bytes, human_count};
        assert_eq!(human_bytes(0), "0 B");
        assert_eq!(human_bytes(1023), "1023 B");
        assert_eq!(human_bytes(1024), "1.00 KiB");
        assert_eq!(human_bytes(1536 * 1024), "1.50 MiB");
        assert_eq!(human_bytes(20 * (1 << 30)), "20.0 GiB");
        assert_eq!(human_bytes(117 * (1 << 20) + 5), "117 MiB");
        assert_eq!(human_bytes(1024 * 1024 - 1), "1.00 MiB");
        assert_eq!(human_bytes(u64::MAX), "16.0 EiB");
        assert_eq!(human_count(4), "4");
        assert_eq!(human_count(999), "999");
        assert_eq!(human_count(1000), "1.00K");
        assert_eq!(human_count(124_439_808), "124M");
        assert_eq!(human_count(5_368_709_120), "5.37B");
        assert_eq!(human_count(999_999), "1.00M");
        assert_eq!(human_count(u64::MAX), "18447Q");
    }

    #[test]
    fn table_text_has_no_trailing_whitespace() {
        let mut table = comfy_table::Table::new();
        table.load_preset(comfy_table::presets::NOTHING);
        table.set_header(["a", "bbbbbb"]);
        table.add_row(["long value", ""]);
        let text = super::table_text(&table);
        assert!(text.lines().all(|l| l == l.trim_end()), "{text:?}");
        assert_eq!(text.lines().count(), 2);
    }

    /// A writer whose bytes the test reads back.
    #[derive(Clone, Default)]
    struct Shared(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

    impl std::io::Write for Shared {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Shared {
        fn text(&self) -> String {
            String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
        }
    }

    /// A reader that went away: every write is a broken pipe.
    struct Closed;

    impl std::io::Write for Closed {
        fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
            Err(std::io::ErrorKind::BrokenPipe.into())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Err(std::io::ErrorKind::BrokenPipe.into())
        }
    }

    fn printer(json: bool, quiet: bool) -> (super::Printer, Shared, Shared) {
        let (out, err) = (Shared::default(), Shared::default());
        let p = super::Printer::with_writers(json, quiet, false, out.clone(), err.clone());
        (p, out, err)
    }

    #[test]
    fn a_piped_table_renders_into_the_writer() {
        use std::io::Write;
        let (p, out, err) = printer(false, false);
        let mut table = p.table();
        table.set_header(["name", "bytes"]);
        table.add_row(["w", "24 B"]);
        table.add_row(["bias", "2 B"]);
        writeln!(p.out(), "{}", super::table_text(&table)).unwrap();
        assert_eq!(out.text(), " name  bytes\n w     24 B\n bias  2 B\n");
        assert_eq!(err.text(), "");
    }

    #[test]
    fn a_terminal_table_is_box_drawn() {
        let (out, err) = (Shared::default(), Shared::default());
        let p = super::Printer::with_writers(false, false, false, out, err).on_terminal(true);
        let mut table = p.table();
        table.set_header(["a"]);
        table.add_row(["b"]);
        let text = super::table_text(&table);
        assert!(text.starts_with('┌'), "{text}");
        assert!(text.lines().all(|l| l == l.trim_end()), "{text:?}");
    }

    #[test]
    fn the_plain_table_writes_what_comfy_table_renders() {
        let (p, ..) = printer(false, false);
        let rows: Vec<Vec<&str>> = vec![
            vec!["name", "dtype", "x"],
            vec!["café", "F32", ""],
            vec!["漢字名", "BF16", "e\u{301}"],
            vec!["a\u{a0}", "", "wide 漢"],
            vec!["", "I8", "last\u{3000}"],
        ];
        let mut table = p.table();
        table.set_header(rows[0].clone());
        for r in &rows[1..] {
            table.add_row(r.clone());
        }
        let mut plain = super::PlainTable::new(&rows[0]);
        for r in &rows[1..] {
            plain.measure(r);
        }
        let mut streamed = Vec::new();
        plain.write_header(&mut streamed, &rows[0]).unwrap();
        for r in &rows[1..] {
            plain.write_row(&mut streamed, r).unwrap();
        }
        let expected = format!("{}\n", super::table_text(&table));
        assert_eq!(String::from_utf8(streamed).unwrap(), expected);
    }

    #[test]
    fn a_json_line_is_one_compact_line() {
        let (p, out, err) = printer(true, false);
        p.json_line(&serde_json::json!({"b": [1, 2], "a": "é\u{1b}"}))
            .unwrap();
        assert_eq!(out.text(), "{\"a\":\"é\\u001b\",\"b\":[1,2]}\n");
        assert_eq!(err.text(), "");
    }

    #[test]
    fn chatter_goes_to_the_error_writer_unless_quiet() {
        let (p, out, err) = printer(false, false);
        p.info("working");
        p.warn("name \u{202e}x");
        assert_eq!(out.text(), "");
        assert_eq!(err.text(), "working\ntlio: warning: name \\u{202e}x\n");
        let (q, _, err) = printer(false, true);
        q.info("working");
        q.warn("careful");
        assert_eq!(err.text(), "");
    }

    #[test]
    fn a_closed_reader_is_a_broken_pipe_not_a_panic() {
        use std::io::Write;
        let p = super::Printer::with_writers(true, false, false, Closed, Shared::default());
        let e = p.json_line(&serde_json::json!({"a": 1})).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::BrokenPipe);
        assert!(crate::error::is_broken_pipe(&anyhow::Error::from(e)));
        let p = super::Printer::with_writers(false, false, false, Closed, Shared::default());
        let e = writeln!(p.out(), "row").unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::BrokenPipe);
        let mut table = super::PlainTable::new(&["a"]);
        table.measure(&["b"]);
        let e = table.write_row(&mut p.out(), &["b"]).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::BrokenPipe);
        // Chatter on a closed stderr is dropped, never an error or a panic.
        let p = super::Printer::with_writers(false, false, false, Shared::default(), Closed);
        p.info("still fine");
    }

    #[test]
    fn significant_digits_for_people() {
        use super::significant;
        assert_eq!(significant(1e-8), "1e-8");
        assert_eq!(significant(2.5), "2.5");
        assert_eq!(significant(4.0), "4");
        assert_eq!(significant(1.118033988749895), "1.11803");
        assert_eq!(significant(-0.000123456789), "-0.000123457");
        assert_eq!(significant(123456.7), "123457");
        assert_eq!(significant(3.3895313892515355e38), "3.38953e38");
        assert_eq!(significant(0.0), "0");
        assert_eq!(significant(-65504.0), "-65504");
        assert_eq!(significant(f64::MAX), "1.79769e308");
    }
}
