//! The rank simulator's bench (docs/checkpoints.md, bench/sharded_ranks.sh): for R =
//! 64, 512, 4,096 and 16,384 simulated ranks and T = 1,000 tensors of a 70B-class
//! model, under FSDP, FSDP x TP and HSDP, the time of rank 0's pre-commit work and its
//! peak memory (a counting allocator), and the read plan of one rank of another layout.
//!
//! Usage: `rank_sim [--tensors T] [--max-gib G] [R...]`. A run whose memory, predicted
//! from the previous R of its layout, would pass G GiB (default 6) is skipped and says
//! so, so that the bench never exhausts a shared machine.

mod sim;

use std::alloc::{GlobalAlloc, Layout as AllocLayout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

/// The system allocator, counting the bytes live and their peak.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is forwarded to the system allocator with the same arguments;
// the counters are only statistics.
#[allow(unsafe_code, reason = "a counting global allocator around System")]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: AllocLayout) -> *mut u8 {
        // SAFETY: the caller's contract is System's.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            let now = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: AllocLayout) {
        // SAFETY: `ptr` came from `alloc` with this layout.
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: AllocLayout, new: usize) -> *mut u8 {
        // SAFETY: the caller's contract is System's.
        let p = unsafe { System.realloc(ptr, layout, new) };
        if !p.is_null() {
            LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
            let now = LIVE.fetch_add(new, Ordering::Relaxed) + new;
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        p
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

const GIB: f64 = (1u64 << 30) as f64;

fn main() {
    if let Err(e) = bench() {
        eprintln!("rank_sim: error: {e}");
        std::process::exit(1);
    }
}

fn bench() -> Result<(), String> {
    let mut tensors = 1000usize;
    let mut max_gib = 6.0f64;
    let mut ranks: Vec<u64> = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--tensors" => tensors = number(args.next(), "--tensors")?,
            "--max-gib" => max_gib = number(args.next(), "--max-gib")?,
            r => ranks.push(number(Some(r.to_string()), "a rank count")?),
        }
    }
    if ranks.is_empty() {
        ranks = vec![64, 512, 4096, 16384];
    }
    let params = sim::model(tensors);
    println!("T = {tensors} tensors (float32, 70B-class shapes); CPU times in ms, memory in MiB");
    println!(
        "{:>6} {:>9} {:>9} {:>9} {:>9} | {:>8} {:>8} {:>8} {:>8} {:>9} {:>9} | {:>8} {:>8} {:>7}",
        "R",
        "layout",
        "reported",
        "chunks",
        "table",
        "assign",
        "tensors",
        "check",
        "manifest",
        "pre-commit",
        "peak",
        "open",
        "plan",
        "pieces"
    );
    for layout in sim::Layout::ALL {
        // Peak bytes per reported chunk of the previous run of this layout.
        let mut per_chunk: Option<f64> = None;
        for &r in &ranks {
            let reported: usize = (0..r)
                .map(|k| {
                    params
                        .iter()
                        .filter(|p| sim::rank_box(p, layout, r, k).is_some())
                        .count()
                })
                .sum();
            if let Some(b) = per_chunk {
                let predicted = b * reported as f64 / GIB;
                if predicted > max_gib {
                    println!(
                        "{r:>6} {:>9} {reported:>9}  skipped: predicted {predicted:.1} GiB > --max-gib {max_gib}",
                        layout.name()
                    );
                    continue;
                }
            }
            let o = sim::run(&params, layout, r, r / 2 + 3, &cpu, &mut || {
                PEAK.store(LIVE.load(Ordering::Relaxed), Ordering::Relaxed);
            })?;
            let peak = PEAK.load(Ordering::Relaxed);
            per_chunk = Some(peak as f64 / o.reported.max(1) as f64);
            row(r, layout, &o, peak);
        }
    }
    Ok(())
}

/// One line of the table.
fn row(r: u64, layout: sim::Layout, o: &sim::Outcome, peak: usize) {
    let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
    let mib = |b: usize| b as f64 / (1u64 << 20) as f64;
    println!(
        "{r:>6} {:>9} {:>9} {:>9} {:>8.1}M | {:>8.0} {:>8.0} {:>8.0} {:>8.0} {:>9.0} {:>8.0}M | {:>8} {:>8.2} {:>7}",
        layout.name(),
        o.reported,
        o.chunks,
        mib(o.table_bytes),
        ms(o.assign),
        ms(o.requests),
        ms(o.table),
        ms(o.manifest),
        ms(o.pre_commit()),
        mib(peak),
        if o.table_bytes as u64 > tlio_core::checkpoint::sharded::table::MAX_TABLE_BYTES {
            "refused".to_string()
        } else {
            format!("{:.0}", ms(o.open))
        },
        ms(o.plan),
        o.pieces,
    );
}

/// CPU time of the process: the machine may be shared, and rank 0's work is one thread.
fn cpu() -> std::time::Duration {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `t` is a valid timespec for the call to fill.
    #[allow(unsafe_code, reason = "the process CPU clock has no safe std API")]
    let ok = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut t) } == 0;
    if !ok {
        return sim::wall();
    }
    std::time::Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

fn number<T: std::str::FromStr>(v: Option<String>, what: &str) -> Result<T, String> {
    v.as_deref()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("{what} takes a number"))
}
