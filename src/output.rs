//! The one output layer every command shares: results to stdout (human table or JSON),
//! chatter and progress to stderr, progress bars only on a terminal and never with
//! `--quiet` or `--json`.
//!
//! Invariant: nothing here panics on a closed pipe; every write returns `io::Result`
//! so that a broken pipe travels up to `error::report`, which exits 0 quietly.

use std::io::{self, IsTerminal, Write};

use comfy_table::{presets, ContentArrangement, Table};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::Serialize;

/// Decides where and how a command's output goes.
#[derive(Debug, Clone)]
pub struct Printer {
    /// Print results as JSON instead of tables.
    pub json: bool,
    /// Silence progress and all non-error chatter.
    pub quiet: bool,
    stderr_tty: bool,
    stdout_tty: bool,
}

impl Printer {
    /// A printer for the given global flags, looking at the real terminals.
    pub fn new(json: bool, quiet: bool) -> Self {
        Printer {
            json,
            quiet,
            stderr_tty: io::stderr().is_terminal(),
            stdout_tty: io::stdout().is_terminal(),
        }
    }

    /// Standard output, locked, for results.
    pub fn out(&self) -> io::StdoutLock<'static> {
        io::stdout().lock()
    }

    /// Write one JSON document (compact, one line) to stdout.
    pub fn json_line<T: Serialize + ?Sized>(&self, value: &T) -> io::Result<()> {
        let mut out = self.out();
        // `io::Error::from` keeps the kind of an I/O failure (a broken pipe must stay
        // a broken pipe to end quietly); other serde errors become InvalidData.
        serde_json::to_writer(&mut out, value).map_err(io::Error::from)?;
        out.write_all(b"\n")?;
        out.flush()
    }

    /// Write one JSON document pretty-printed to stdout.
    pub fn json_pretty<T: Serialize + ?Sized>(&self, value: &T) -> io::Result<()> {
        let mut out = self.out();
        serde_json::to_writer_pretty(&mut out, value).map_err(io::Error::from)?;
        out.write_all(b"\n")?;
        out.flush()
    }

    /// A line of chatter on stderr, unless quiet.
    pub fn info(&self, line: impl AsRef<str>) {
        if !self.quiet {
            let _ = writeln!(io::stderr().lock(), "{}", line.as_ref());
        }
    }

    /// A warning on stderr; warnings are not errors, so `--quiet` silences them too.
    pub fn warn(&self, line: impl AsRef<str>) {
        if !self.quiet {
            // Warnings often carry names from files: never let them reach the terminal raw.
            let _ = writeln!(
                io::stderr().lock(),
                "tlio: warning: {}",
                crate::core::text::escape(line.as_ref())
            );
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
        table
    }
}
