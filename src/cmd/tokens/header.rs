//! `tlio tokens header`: one report row per shard (local, or in object storage through a
//! range request of its header), only the header words that passed validation shown; an
//! unreadable file is an error after the rows read before it.

use super::*;

/// One row of `tokens header`.
#[derive(Debug, Serialize)]
struct HeaderRow {
    file: String,
    magic: Option<i32>,
    version: Option<i32>,
    dtype: Option<&'static str>,
    n: Option<i32>,
    vocab_size: Option<i32>,
    size: u64,
    valid: bool,
    error: Option<String>,
}

/// The report row of one file and, when it does not validate, why. `Err` when the file
/// cannot be read at all.
fn header_row(
    path: &Path,
    check_ids: bool,
    vocab: Option<u32>,
) -> Result<(HeaderRow, Option<TokensError>), TokensError> {
    let file = path.display().to_string();
    let report = tokens::inspect_header(path)?;
    Ok(row_of(
        file,
        report,
        &mut |v| {
            if check_ids || vocab.is_some() {
                Shard::open(path, v).map(|_| ())
            } else {
                Ok(())
            }
        },
        vocab,
    ))
}

/// The row of a shard object in storage, from a range request of its header; with
/// `--check-ids` or `--vocab-size`, every id is checked in the shard fetched through
/// the verified local cache (as `tokens windows` fetches it), its errors naming the URL.
fn remote_header_row(
    url: &tlio_core::s3::S3Url,
    check_ids: bool,
    vocab: Option<u32>,
) -> anyhow::Result<(HeaderRow, Option<TokensError>)> {
    let report = tlio_core::remote::shard_header(url)
        .with_context(|| format!("cannot read the header of {url}"))?;
    let mut ids = Ok(());
    if (check_ids || vocab.is_some()) && report.header.is_ok() {
        let source = [tlio_core::remote::url_path(url)];
        ids = match tlio_core::remote::shards::open_shards(&source, vocab) {
            Ok(_) => Ok(()),
            Err(tlio_core::remote::RemoteError::Tokens(e)) => Err(e),
            Err(e) => {
                return Err(anyhow::Error::new(e).context(format!("cannot check the ids of {url}")))
            }
        };
    }
    let mut ids = Some(ids);
    Ok(row_of(
        url.to_string(),
        report,
        &mut |_| ids.take().unwrap_or(Ok(())),
        vocab,
    ))
}

/// A row from a header report; `check` is the further verdict of a valid header.
fn row_of(
    file: String,
    report: HeaderReport,
    check: &mut dyn FnMut(Option<u32>) -> Result<(), TokensError>,
    vocab: Option<u32>,
) -> (HeaderRow, Option<TokensError>) {
    let HeaderReport {
        size,
        words,
        header,
    } = report;
    let dtype = header.as_ref().ok().map(|h| h.dtype.name());
    let verdict = match header {
        Ok(_) => check(vocab),
        Err(e) => Err(e),
    };
    // Show only the header words that passed validation: after a bad magic nothing in
    // the header means anything, after a bad version only the magic does.
    let trusted = match &verdict {
        Err(TokensError::BadMagic { .. }) => 0,
        Err(TokensError::BadVersion { .. }) => 1,
        Err(TokensError::NegativeCount { .. }) => 2,
        Err(TokensError::NegativeVocab { .. }) => 3,
        _ => 4,
    };
    let word = |i: usize| {
        words
            .and_then(|w| w.get(i).copied())
            .filter(|_| i < trusted)
    };
    let row = HeaderRow {
        file,
        magic: word(0),
        version: word(1),
        dtype,
        n: word(2),
        vocab_size: word(3),
        size,
        valid: verdict.is_ok(),
        error: verdict.as_ref().err().map(ToString::to_string),
    };
    (row, verdict.err())
}

pub(super) fn header(args: HeaderArgs, printer: &Printer) -> anyhow::Result<Outcome> {
    let vocab = args.vocab_size.map(vocab_arg).transpose()?;
    let mut rows = Vec::new();
    let mut any_invalid = false;
    for path in &args.files {
        // A file that cannot be read is an error (exit 2); an invalid file is a "no"
        // answer in the report. The files read before the error are still reported
        // (cli.md: a report line for every file read), then the error.
        let row = match crate::cmd::s3_url(path)? {
            Some(url) => match remote_header_row(&url, args.check_ids, vocab) {
                Ok(row) => Ok(row),
                Err(e) => {
                    print_header_rows(&rows, printer)?;
                    return Err(e);
                }
            },
            None => header_row(path, args.check_ids, vocab),
        };
        let failed = match row {
            // The row of an unreadable file is not a verdict: it is left out.
            Ok((_, Some(e))) if e.kind() == FailureKind::Operational => Some(e),
            Ok((row, err)) => {
                any_invalid |= err.is_some();
                rows.push(row);
                None
            }
            Err(e) => Some(e),
        };
        if let Some(e) = failed {
            print_header_rows(&rows, printer)?;
            return Err(e.into());
        }
    }
    print_header_rows(&rows, printer)?;
    Ok(Outcome::from_ok(!any_invalid))
}

fn print_header_rows(rows: &[HeaderRow], printer: &Printer) -> anyhow::Result<()> {
    if rows.is_empty() {
        return Ok(());
    }
    if printer.json {
        for row in rows {
            printer.json_line(row)?;
        }
    } else {
        let mut table = printer.table();
        table.set_header([
            "file", "magic", "version", "dtype", "n", "V", "size", "valid",
        ]);
        let show = |v: Option<i64>| v.map_or("-".to_string(), |v| v.to_string());
        for row in rows {
            let valid = match &row.error {
                None => printer.cell("yes", crate::output::Tone::Good),
                // The row already names the file.
                Some(e) => {
                    let why = e
                        .strip_prefix(row.file.as_str())
                        .and_then(|r| r.strip_prefix(": "))
                        .unwrap_or(e);
                    printer.cell(format!("no: {}", escape(why)), crate::output::Tone::Bad)
                }
            };
            table.add_row(vec![
                comfy_table::Cell::new(escape(&row.file)),
                comfy_table::Cell::new(show(row.magic.map(i64::from))),
                comfy_table::Cell::new(show(row.version.map(i64::from))),
                comfy_table::Cell::new(row.dtype.unwrap_or("-")),
                comfy_table::Cell::new(show(row.n.map(i64::from))),
                comfy_table::Cell::new(show(row.vocab_size.map(i64::from))),
                comfy_table::Cell::new(crate::output::human_bytes(row.size)),
                valid,
            ]);
        }
        let mut out = printer.out();
        writeln!(out, "{}", crate::output::table_text(&table))?;
        out.flush()?;
    }
    Ok(())
}
