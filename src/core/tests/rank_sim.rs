//! The rank simulator (`examples/rank_sim`) at 64 and 512 ranks and T = 1,000 tensors of
//! a 70B-class model: under FSDP, FSDP x TP and HSDP, rank 0's planning through the
//! save's own core functions gives one writer per distinct chunk among its holders, a
//! table whose chunks tile every tensor, and a resharded rank's read plan that fills its
//! regions exactly; a rank whose report is missing is a coverage error. No timing is
//! asserted (the bench, bench/sharded_ranks.sh, measures).

#[path = "../examples/rank_sim/sim.rs"]
#[allow(dead_code, reason = "the bench reads the timings and sizes")]
mod sim;

#[test]
fn simulated_saves_plan_exactly_in_every_layout_at_64_and_512_ranks() {
    let params = sim::model(1000);
    assert_eq!(params.len(), 1000);
    for layout in sim::Layout::ALL {
        for ranks in [64u64, 512] {
            let o = sim::run(
                &params,
                layout,
                ranks,
                ranks / 2 + 3,
                &sim::wall,
                &mut || {},
            )
            .unwrap_or_else(|e| panic!("{} at {ranks} ranks: {e}", layout.name()));
            assert!(o.reported > 0 && o.chunks > 0 && o.pieces > 0);
            assert!(o.chunks <= o.reported);
            match layout {
                // HSDP: the same 32 shards of every tensor, whatever the replicas.
                sim::Layout::Hsdp => assert_eq!(o.chunks, 32 * 1000),
                // FSDP x TP: the norms' chunks are held by the 8 TP ranks alike.
                sim::Layout::FsdpTp => assert!(o.chunks < o.reported),
                sim::Layout::Fsdp => assert_eq!(o.chunks, o.reported),
            }
        }
    }
}

#[test]
fn a_rank_whose_report_is_missing_leaves_a_gap_that_is_refused() {
    let params = sim::model(20);
    let mut reports = sim::reports(&params, sim::Layout::Fsdp, 64);
    if let Some(r) = reports.get_mut(5) {
        r.clear();
    }
    let e = sim::simulate(
        &params,
        reports,
        sim::Layout::FsdpTp,
        64,
        3,
        &sim::wall,
        &mut || {},
    )
    .unwrap_err();
    assert!(e.contains("gap"), "{e}");
}
