//! `tlio tokens windows`: one JSON line per batch of the stream (this rank's rows and
//! the global cursor), resumed from and saved to cursor files by core's session; of a
//! list of shards or of a mixture of sources (`--mix`), whose lines also name each
//! row's source.

use super::*;
use tlio_core::tokens::{Batch, MixtureOptions, Resumable};

/// One line of `tokens windows`.
#[derive(Serialize)]
struct WindowLine<'a, C> {
    inputs: Vec<&'a [i64]>,
    targets: Vec<&'a [i64]>,
    /// A mixture's source of each row (the index of its --mix).
    #[serde(skip_serializing_if = "Option::is_none")]
    sources: Option<&'a [usize]>,
    cursor: C,
}

pub(super) fn windows(args: WindowsArgs, printer: &Printer) -> anyhow::Result<Outcome> {
    let vocab = args.vocab_size.map(vocab_arg).transpose()?;
    args.mix.check_alone(args.report.then_some("--report"))?;
    if let (Some(seed), Some(cursor)) = (args.seed, &args.cursor) {
        // Checked here rather than by clap, whose generic "cannot be used with" does
        // not say why: the seed would silently lose to the cursor's generator.
        return Err(operational(format!(
            "--seed {seed} cannot be used with --cursor {}: the cursor carries the \
             generator's state, so a resumed stream takes its phases from the cursor, \
             not from a seed (drop --seed to resume, or --cursor to start afresh)",
            cursor.display()
        )));
    }
    let rng = Pcg32::seed(args.seed.unwrap_or(0), DEFAULT_SEQ);
    if args.rank >= args.world_size {
        return Err(operational(format!(
            "--rank {} must be below --world-size {}",
            args.rank, args.world_size
        )));
    }
    let ranks = Ranks {
        rank: args.rank,
        world_size: args.world_size,
    };
    let order = if args.shuffle {
        ShardOrder::Shuffled
    } else {
        ShardOrder::InOrder
    };
    let (cursor, save) = (args.cursor.as_deref(), args.save_cursor.as_deref());
    if args.mix.is_mixture() {
        let options = MixtureOptions { ranks, order };
        let shape = (args.seq_len, args.batch);
        let mixture = mix::open_mixture(&args.mix, shape, rng, vocab, options)?;
        let mut session =
            CursorSession::start_with(mixture, cursor, save, args.mix.allow_new_mixture)?;
        if args.report {
            mix::print_report(session.stream(), args.batches, printer)?;
            session.finish()?;
            return Ok(Outcome::Success);
        }
        return print_batches(session, args.batches, printer, |m| {
            let read = m.next_batch()?;
            let sources = read.origins.iter().map(|o| o.source).collect();
            Ok((read.batch, Some(sources)))
        });
    }
    let options = StreamOptions { ranks, order };
    // Local paths and s3:// sources alike (objects fetched once into a verified cache).
    let stream = tlio_core::remote::open_stream(
        &args.shards,
        args.seq_len,
        args.batch,
        rng,
        vocab,
        options,
    )?;
    let session = CursorSession::start(stream, cursor, save)?;
    print_batches(session, args.batches, printer, |s| {
        Ok((s.next_batch()?, None))
    })
}

/// Print `batches` batches of `session`'s stream, each read by `next` (its rows and, of
/// a mixture, each row's source), then save the cursor.
fn print_batches<S>(
    mut session: CursorSession<S>,
    batches: u64,
    printer: &Printer,
    mut next: impl FnMut(&mut S) -> Result<(Batch, Option<Vec<usize>>), TokensError>,
) -> anyhow::Result<Outcome>
where
    S: Resumable,
    S::Cursor: Serialize,
{
    let saving = session.saves_cursor();
    let mut out = BufWriter::new(printer.out());
    let mut line_buf = Vec::new();
    // Once the reader of stdout is gone, batches are no longer printed; the stream
    // still advances when a cursor must be saved, so the file always holds the
    // position after every requested batch, whoever reads stdout.
    let mut stdout_open = true;
    for _ in 0..batches {
        let stream = session.stream();
        let (batch, sources) = next(stream)?;
        if !stdout_open {
            continue;
        }
        let line = WindowLine {
            inputs: (0..batch.batch)
                .filter_map(|b| batch.input_row(b))
                .collect(),
            targets: (0..batch.batch)
                .filter_map(|b| batch.target_row(b))
                .collect(),
            sources: sources.as_deref(),
            cursor: stream.current(),
        };
        // Serialize into memory first, so that a closed stdout surfaces as the plain
        // BrokenPipe error main treats as a quiet exit.
        line_buf.clear();
        serde_json::to_writer(&mut line_buf, &line).map_err(io::Error::other)?;
        line_buf.push(b'\n');
        match out.write_all(&line_buf) {
            Err(e) if e.kind() == io::ErrorKind::BrokenPipe && saving => {
                stdout_open = false;
            }
            other => other?,
        }
    }
    match out.flush() {
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe && saving => {}
        other => other?,
    }
    session.finish()?;
    Ok(Outcome::Success)
}
