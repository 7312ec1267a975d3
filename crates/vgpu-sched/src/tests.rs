//! Scheduler tests with real threads. The GPU is simulated by sleeping
//! for a command's nominal duration while holding the grant and reporting
//! that duration; shares are computed from reported device time, so they
//! do not depend on how late the sleeps wake. Tolerances absorb the rest
//! of the scheduling noise of a loaded two-core machine.

use std::sync::atomic::AtomicBool;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crate::{
    Policy, SchedConfig, SchedError, Scheduler, TenantId, TenantParams, TenantPhase, MAX_WEIGHT,
};

const US: Duration = Duration::from_micros(1);
const MS: Duration = Duration::from_millis(1);

type Log = Arc<Mutex<Vec<TenantId>>>;

fn sched(policy: Policy) -> Scheduler {
    Scheduler::new(SchedConfig::new(policy)).unwrap()
}

fn weight(w: u32) -> TenantParams {
    TenantParams {
        weight: w,
        ..TenantParams::default()
    }
}

fn prio(p: i32) -> TenantParams {
    TenantParams {
        priority: p,
        ..TenantParams::default()
    }
}

/// A worker issuing commands of `cmd` (sleeping `pause` between them)
/// until its acquire fails; logs grants in order if asked.
fn worker(
    s: &Scheduler,
    id: TenantId,
    cmd: Duration,
    pause: Duration,
    log: Option<Log>,
) -> JoinHandle<u64> {
    let s = s.clone();
    thread::spawn(move || {
        let mut n = 0;
        while let Ok(g) = s.acquire(id) {
            if let Some(log) = &log {
                log.lock().unwrap().push(id);
            }
            thread::sleep(cmd);
            g.finish(cmd);
            n += 1;
            if !pause.is_zero() {
                thread::sleep(pause);
            }
        }
        n
    })
}

/// A worker that always has its next command ready: it finishes and asks
/// again in one step with [`crate::Grant::finish_and_acquire`].
fn backlogged_worker(
    s: &Scheduler,
    id: TenantId,
    cmd: Duration,
    log: Option<Log>,
) -> JoinHandle<u64> {
    let s = s.clone();
    thread::spawn(move || {
        let mut n = 0;
        let mut next = s.acquire(id);
        while let Ok(g) = next {
            if let Some(log) = &log {
                log.lock().unwrap().push(id);
            }
            thread::sleep(cmd);
            next = g.finish_and_acquire(cmd);
            n += 1;
        }
        n
    })
}

fn stop(s: &Scheduler, workers: Vec<JoinHandle<u64>>) {
    s.shutdown();
    for w in workers {
        w.join().unwrap();
    }
}

fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        thread::sleep(Duration::from_millis(1));
    }
}

fn wait_phase(s: &Scheduler, id: TenantId, phase: TenantPhase) {
    wait_until(&format!("{id} to be {phase:?}"), || {
        s.stats().tenant(id).is_some_and(|t| t.phase == phase)
    });
}

fn busy_shares(s: &Scheduler, ids: &[TenantId]) -> Vec<f64> {
    let st = s.stats();
    let busy: Vec<f64> = ids
        .iter()
        .map(|&id| st.tenant(id).unwrap().busy.as_secs_f64())
        .collect();
    let total: f64 = busy.iter().sum();
    busy.iter().map(|b| b / total).collect()
}

/// Lengths of runs of consecutive grants to the same tenant.
fn runs(log: &[TenantId]) -> Vec<(TenantId, usize)> {
    let mut out: Vec<(TenantId, usize)> = Vec::new();
    for &id in log {
        match out.last_mut() {
            Some((last, n)) if *last == id => *n += 1,
            _ => out.push((id, 1)),
        }
    }
    out
}

#[test]
fn handles_are_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<Scheduler>();
    fn send<T: Send>() {}
    send::<crate::Grant>();
}

#[test]
fn fair_share_weights_1_2_4() {
    let s = sched(Policy::FairShare);
    let ids = [TenantId(1), TenantId(2), TenantId(3)];
    for (id, w) in ids.iter().zip([1, 2, 4]) {
        s.add_tenant(*id, weight(w)).unwrap();
    }
    let workers = ids
        .iter()
        .map(|&id| worker(&s, id, 500 * US, Duration::ZERO, None))
        .collect();
    thread::sleep(Duration::from_millis(1500));
    let shares = busy_shares(&s, &ids);
    stop(&s, workers);
    eprintln!("fair share 1:2:4: {shares:?}");
    for (share, want) in shares.iter().zip([1.0 / 7.0, 2.0 / 7.0, 4.0 / 7.0]) {
        assert!((share - want).abs() < 0.05, "shares {shares:?}");
    }
}

#[test]
fn fair_share_long_and_short_commands_get_equal_time() {
    let s = sched(Policy::FairShare);
    let (long, short) = (TenantId(1), TenantId(2));
    s.add_tenant(long, weight(1)).unwrap();
    s.add_tenant(short, weight(1)).unwrap();
    let workers = vec![
        worker(&s, long, 4 * MS, Duration::ZERO, None),
        worker(&s, short, 500 * US, Duration::ZERO, None),
    ];
    thread::sleep(Duration::from_millis(1500));
    let shares = busy_shares(&s, &[long, short]);
    let st = s.stats();
    stop(&s, workers);
    eprintln!("long vs short: {shares:?}");
    assert!((shares[0] - 0.5).abs() < 0.05, "shares {shares:?}");
    // The short tenant ran many more commands for the same device time.
    assert!(st.tenant(short).unwrap().commands > 4 * st.tenant(long).unwrap().commands);
}

#[test]
fn cap_holds_while_others_idle() {
    let s = sched(Policy::FairShare);
    let capped = TenantId(1);
    s.add_tenant(
        capped,
        TenantParams {
            cap: Some(0.25),
            ..TenantParams::default()
        },
    )
    .unwrap();
    s.add_tenant(TenantId(2), weight(1)).unwrap();
    s.add_tenant(TenantId(3), weight(1)).unwrap();
    let start = Instant::now();
    let workers = vec![worker(&s, capped, MS, Duration::ZERO, None)];
    thread::sleep(Duration::from_millis(1200));
    let st = s.stats();
    let wall = start.elapsed().as_secs_f64();
    stop(&s, workers);
    let t = st.tenant(capped).unwrap();
    let share = t.busy.as_secs_f64() / wall;
    eprintln!("capped alone: {share:.4}, capped {} times", t.capped);
    assert!(share <= 0.27, "capped share {share}");
    assert!(share >= 0.18, "capped tenant starved: {share}");
    assert!(t.capped > 0);
    assert!(st.gpu.utilization <= 0.27, "{}", st.gpu.utilization);
}

#[test]
fn cap_combines_with_fair_share() {
    let s = sched(Policy::FairShare);
    let (heavy, other) = (TenantId(1), TenantId(2));
    // Weight 4 of 5 would give 80%; the cap keeps it to 25%.
    s.add_tenant(
        heavy,
        TenantParams {
            weight: 4,
            cap: Some(0.25),
            ..TenantParams::default()
        },
    )
    .unwrap();
    s.add_tenant(other, weight(1)).unwrap();
    let start = Instant::now();
    let workers = vec![
        worker(&s, heavy, MS, Duration::ZERO, None),
        worker(&s, other, MS, Duration::ZERO, None),
    ];
    thread::sleep(Duration::from_millis(1200));
    let st = s.stats();
    let wall = start.elapsed().as_secs_f64();
    stop(&s, workers);
    let heavy_share = st.tenant(heavy).unwrap().busy.as_secs_f64() / wall;
    let other_share = st.tenant(other).unwrap().busy.as_secs_f64() / wall;
    eprintln!("capped with fair share: {heavy_share:.4} vs {other_share:.4}");
    assert!(heavy_share <= 0.27, "capped share {heavy_share}");
    assert!(heavy_share >= 0.15, "capped share {heavy_share}");
    // Without the cap the heavy tenant would get four times the other's
    // time; the other now gets the rest of the GPU (as far as its sleeps
    // on a loaded machine let it).
    assert!(other_share > heavy_share, "other share {other_share}");
}

#[test]
fn priority_with_aging_lets_low_progress() {
    let s = sched(Policy::Priority { aging: 5 * MS });
    let (high, low) = (TenantId(1), TenantId(2));
    s.add_tenant(high, prio(10)).unwrap();
    s.add_tenant(low, prio(0)).unwrap();
    let workers = vec![
        worker(&s, high, MS, Duration::ZERO, None),
        worker(&s, low, MS, Duration::ZERO, None),
    ];
    thread::sleep(Duration::from_millis(1000));
    let st = s.stats();
    stop(&s, workers);
    let (h, l) = (st.tenant(high).unwrap(), st.tenant(low).unwrap());
    eprintln!(
        "priority: high {} cmds wait {:?}; low {} cmds wait {:?}",
        h.commands, h.wait, l.commands, l.wait
    );
    // Low waits ~10 aging intervals (50 ms) per command: about 1 in 50.
    assert!(l.commands >= 3, "low starved: {l:?}");
    let high_share = h.busy.as_secs_f64() / (h.busy + l.busy).as_secs_f64();
    assert!(high_share >= 0.75, "high share {high_share}");
    assert!(l.commands <= 100, "low ran too often: {l:?}");
    // Low did wait for its aging when high kept asking.
    assert!(l.wait.max >= 30 * MS, "low waited too little: {:?}", l.wait);
    assert!(h.wait.p50 < 2 * MS, "high waited: {:?}", h.wait);
}

#[test]
fn priority_order_and_fifo_ties() {
    let s = sched(Policy::Priority {
        aging: Duration::from_secs(3600),
    });
    let holder = TenantId(0);
    s.add_tenant(holder, prio(100)).unwrap();
    let g = s.acquire(holder).unwrap();
    let order: Log = Arc::default();
    let mut threads = Vec::new();
    // Tenant 4 has the same priority as 2 but arrives later.
    for (id, p) in [(1, 1), (2, 5), (3, 3), (4, 5)] {
        let id = TenantId(id);
        s.add_tenant(id, prio(p)).unwrap();
        let (s2, order) = (s.clone(), order.clone());
        threads.push(thread::spawn(move || {
            let g = s2.acquire(id).unwrap();
            order.lock().unwrap().push(id);
            g.finish(10 * US);
        }));
        wait_phase(&s, id, TenantPhase::Waiting);
    }
    g.finish(MS);
    for t in threads {
        t.join().unwrap();
    }
    let order: Vec<u32> = order.lock().unwrap().iter().map(|t| t.0).collect();
    assert_eq!(order, [2, 4, 3, 1]);
}

#[test]
fn round_robin_turns_follow_the_slice() {
    let s = sched(Policy::RoundRobin { slice: 2 * MS });
    let ids = [TenantId(1), TenantId(2), TenantId(3)];
    let log: Log = Arc::default();
    for id in ids {
        s.add_tenant(id, TenantParams::default()).unwrap();
    }
    let workers = ids
        .iter()
        .map(|&id| worker(&s, id, 500 * US, Duration::ZERO, Some(log.clone())))
        .collect();
    thread::sleep(Duration::from_millis(800));
    stop(&s, workers);
    let log = log.lock().unwrap();
    let runs = runs(&log);
    eprintln!(
        "round robin runs: {:?}",
        runs.iter().map(|r| r.1).collect::<Vec<_>>()
    );
    assert!(runs.len() > 30, "{runs:?}");
    // Interior runs: 2 ms slice / 0.5 ms commands = 4 commands per turn.
    let interior = &runs[1..runs.len() - 1];
    let exact = interior.iter().filter(|(_, n)| *n == 4).count();
    assert!(exact * 10 >= interior.len() * 9, "runs {runs:?}");
    assert!(interior.iter().all(|(_, n)| *n <= 8), "runs {runs:?}");
    // Turns go round in id order.
    let in_order = runs
        .windows(2)
        .filter(|w| w[1].0 .0 == w[0].0 .0 % 3 + 1)
        .count();
    assert!(in_order * 10 >= (runs.len() - 1) * 9, "runs {runs:?}");
}

/// Mean run length of `a` when it pauses 1 ms between commands and the
/// other tenant saturates, under round robin with a 20 ms slice.
fn round_robin_with_gaps(grace: Duration) -> f64 {
    let s = Scheduler::new(SchedConfig {
        grace,
        ..SchedConfig::new(Policy::RoundRobin { slice: 20 * MS })
    })
    .unwrap();
    let (a, b) = (TenantId(1), TenantId(2));
    s.add_tenant(a, TenantParams::default()).unwrap();
    s.add_tenant(b, TenantParams::default()).unwrap();
    let log: Log = Arc::default();
    let workers = vec![
        worker(&s, a, MS, MS, Some(log.clone())),
        worker(&s, b, MS, Duration::ZERO, Some(log.clone())),
    ];
    thread::sleep(Duration::from_millis(600));
    stop(&s, workers);
    let log = log.lock().unwrap();
    let runs: Vec<usize> = runs(&log)
        .into_iter()
        .filter(|(id, _)| *id == a)
        .map(|(_, n)| n)
        .collect();
    assert!(!runs.is_empty());
    runs.iter().sum::<usize>() as f64 / runs.len() as f64
}

#[test]
fn round_robin_grace_keeps_the_turn_across_gaps() {
    // The gap (a 1 ms sleep) is well inside a 10 ms grace: a keeps its turn.
    let kept = round_robin_with_gaps(10 * MS);
    eprintln!("mean run with grace: {kept}");
    assert!(kept >= 6.0, "mean run with grace {kept}");
}

#[test]
fn round_robin_without_grace_hands_over_in_gaps() {
    let lost = round_robin_with_gaps(Duration::ZERO);
    eprintln!("mean run without grace: {lost}");
    assert!(lost <= 1.5, "mean run without grace {lost}");
}

#[test]
fn zero_time_commands_cannot_hold_the_gpu() {
    // Every command is charged at least `min_charge` (20 µs here): a
    // tenant reporting no device time at all still uses up a 2 ms slice in
    // 100 commands, and loses its fair-share or FIFO turn after one.
    for (policy, most) in [
        (Policy::RoundRobin { slice: 2 * MS }, 100),
        (Policy::FairShare, 2),
        (Policy::Priority { aging: MS }, 1),
    ] {
        // A long grace: this thread being descheduled between two commands
        // must not end a's turn early.
        let s = Scheduler::new(SchedConfig {
            min_charge: 20 * US,
            grace: Duration::from_secs(1),
            ..SchedConfig::new(policy)
        })
        .unwrap();
        let (a, b) = (TenantId(1), TenantId(2));
        s.add_tenant(a, TenantParams::default()).unwrap();
        s.add_tenant(b, TenantParams::default()).unwrap();
        // a holds the GPU while b gets in line.
        let g = s.acquire(a).unwrap();
        let s2 = s.clone();
        let waiter = thread::spawn(move || s2.acquire(b).unwrap().finish(Duration::ZERO));
        wait_phase(&s, b, TenantPhase::Waiting);
        g.finish(Duration::ZERO);
        // a asks again at once after every command, as fast as it can.
        let mut before_b = 1;
        loop {
            let g = s.acquire(a).unwrap();
            if s.stats().tenant(b).unwrap().commands > 0 {
                g.finish(Duration::ZERO);
                break;
            }
            before_b += 1;
            g.finish(Duration::ZERO);
            assert!(before_b <= 10_000, "{policy:?}: b never ran");
        }
        waiter.join().unwrap();
        assert!(
            before_b <= most,
            "{policy:?}: {before_b} commands of a before b's"
        );
        if matches!(policy, Policy::RoundRobin { .. }) {
            assert_eq!(before_b, most);
        }
    }
}

#[test]
fn remove_wakes_a_blocked_acquire() {
    let s = Scheduler::new(SchedConfig {
        cap_window: Duration::from_secs(1),
        ..SchedConfig::new(Policy::FairShare)
    })
    .unwrap();
    let (holder, blocked, capped) = (TenantId(1), TenantId(2), TenantId(3));
    s.add_tenant(holder, TenantParams::default()).unwrap();
    s.add_tenant(blocked, TenantParams::default()).unwrap();
    s.add_tenant(
        capped,
        TenantParams {
            cap: Some(0.1),
            ..TenantParams::default()
        },
    )
    .unwrap();
    // Use up the capped tenant's budget for about a second.
    s.acquire(capped)
        .unwrap()
        .finish(Duration::from_millis(500));
    let g = s.acquire(holder).unwrap();
    let (tx, rx) = mpsc::channel();
    for id in [blocked, capped] {
        let (s2, tx) = (s.clone(), tx.clone());
        thread::spawn(move || tx.send((id, s2.acquire(id).map(|_| ()))).unwrap());
        wait_phase(&s, id, TenantPhase::Waiting);
    }
    for id in [blocked, capped] {
        let removed = s.remove_tenant(id).unwrap();
        assert_eq!(removed.id, id);
        let (who, res) = rx.recv_timeout(Duration::from_secs(2)).unwrap();
        assert_eq!((who, res), (id, Err(SchedError::Removed(id))));
    }
    // The holder's grant is untouched; the GPU counts it after its removal.
    s.remove_tenant(holder).unwrap();
    g.finish(MS);
    assert_eq!(s.stats().gpu.commands, 2);
    assert_eq!(s.stats().gpu.tenants, 0);
    assert_eq!(
        s.acquire(holder).unwrap_err(),
        SchedError::UnknownTenant(holder)
    );
}

#[test]
fn readding_a_tenant_fails_the_old_waiter() {
    let s = sched(Policy::FairShare);
    let (holder, t) = (TenantId(1), TenantId(2));
    s.add_tenant(holder, TenantParams::default()).unwrap();
    s.add_tenant(t, TenantParams::default()).unwrap();
    let g = s.acquire(holder).unwrap();
    let s2 = s.clone();
    let waiter = thread::spawn(move || s2.acquire(t).map(|_| ()));
    wait_phase(&s, t, TenantPhase::Waiting);
    s.remove_tenant(t).unwrap();
    s.add_tenant(t, TenantParams::default()).unwrap();
    assert_eq!(waiter.join().unwrap(), Err(SchedError::Removed(t)));
    g.finish(MS);
    s.acquire(t).unwrap().finish(MS);
}

#[test]
fn shutdown_wakes_everyone() {
    let s = Scheduler::new(SchedConfig {
        cap_window: Duration::from_secs(1),
        ..SchedConfig::new(Policy::RoundRobin { slice: MS })
    })
    .unwrap();
    let holder = TenantId(0);
    s.add_tenant(holder, TenantParams::default()).unwrap();
    let capped = TenantId(9);
    s.add_tenant(
        capped,
        TenantParams {
            cap: Some(0.01),
            ..TenantParams::default()
        },
    )
    .unwrap();
    s.acquire(capped)
        .unwrap()
        .finish(Duration::from_millis(100));
    let g = s.acquire(holder).unwrap();
    let mut waiters = Vec::new();
    for id in [TenantId(1), TenantId(2), TenantId(3), capped] {
        if id != capped {
            s.add_tenant(id, TenantParams::default()).unwrap();
        }
        let s2 = s.clone();
        waiters.push(thread::spawn(move || s2.acquire(id).map(|_| ())));
        wait_phase(&s, id, TenantPhase::Waiting);
    }
    let t0 = Instant::now();
    s.shutdown();
    for w in waiters {
        assert_eq!(w.join().unwrap(), Err(SchedError::Shutdown));
    }
    assert!(t0.elapsed() < Duration::from_secs(1));
    assert!(s.is_shutdown());
    assert_eq!(s.acquire(TenantId(1)).unwrap_err(), SchedError::Shutdown);
    assert_eq!(
        s.add_tenant(TenantId(7), TenantParams::default()),
        Err(SchedError::Shutdown)
    );
    g.finish(MS);
    let st = s.stats();
    assert_eq!(st.gpu.commands, 2);
    assert!(st.tenants.iter().all(|t| t.phase == TenantPhase::Idle));
}

#[test]
fn stats_are_consistent() {
    let s = sched(Policy::FairShare);
    let ids = [TenantId(1), TenantId(2), TenantId(3)];
    let log: Log = Arc::default();
    for (id, w) in ids.iter().zip([1, 3, 2]) {
        s.add_tenant(*id, weight(w)).unwrap();
    }
    let workers = ids
        .iter()
        .zip([300 * US, MS, 2 * MS])
        .map(|(&id, cmd)| worker(&s, id, cmd, Duration::ZERO, Some(log.clone())))
        .collect();
    s.record_bytes(ids[0], 4096).unwrap();
    s.record_bytes(ids[0], 100).unwrap();
    thread::sleep(Duration::from_millis(500));
    stop(&s, workers);
    let st = s.stats();
    let log = log.lock().unwrap();
    let sum_busy: Duration = st.tenants.iter().map(|t| t.busy).sum();
    assert_eq!(sum_busy, st.gpu.busy);
    let sum_commands: u64 = st.tenants.iter().map(|t| t.commands).sum();
    let sum_grants: u64 = st.tenants.iter().map(|t| t.grants).sum();
    assert_eq!(sum_commands, st.gpu.commands);
    assert_eq!(sum_grants, st.gpu.grants);
    assert_eq!(st.gpu.grants, st.gpu.commands);
    assert_eq!(st.gpu.commands, log.len() as u64);
    let switches = log.windows(2).filter(|w| w[0] != w[1]).count() as u64;
    assert_eq!(st.gpu.switches, switches);
    assert!(switches > 10);
    // Wall time held covers the (sleep-simulated) device time.
    assert!(st.gpu.held >= st.gpu.busy);
    assert!(st.gpu.utilization > 0.3 && st.gpu.utilization <= 1.0);
    for t in &st.tenants {
        assert_eq!(t.wait.samples, t.grants);
        assert!(t.wait.p50 <= t.wait.p90 && t.wait.p90 <= t.wait.p99 && t.wait.p99 <= t.wait.max);
        assert_eq!(t.phase, TenantPhase::Idle);
    }
    assert_eq!(st.tenant(ids[0]).unwrap().bytes, 4196);
    assert_eq!(st.gpu.tenants, 3);
    assert_eq!(st.gpu.waiting, 0);
}

#[test]
fn dropping_a_grant_charges_wall_time() {
    let s = sched(Policy::FairShare);
    let t = TenantId(1);
    s.add_tenant(t, TenantParams::default()).unwrap();
    let g = s.acquire(t).unwrap();
    assert_eq!(g.tenant(), t);
    thread::sleep(5 * MS);
    drop(g);
    let st = s.stats();
    assert!(st.tenant(t).unwrap().busy >= 5 * MS);
    assert_eq!(st.tenant(t).unwrap().commands, 1);
    // The GPU is free again.
    s.acquire(t).unwrap().finish(US);
}

#[test]
fn acquire_timeout_gives_up_and_leaves_no_trace() {
    let s = sched(Policy::FairShare);
    let (a, b) = (TenantId(1), TenantId(2));
    s.add_tenant(a, TenantParams::default()).unwrap();
    s.add_tenant(b, TenantParams::default()).unwrap();
    let g = s.acquire(a).unwrap();
    let t0 = Instant::now();
    assert!(s.acquire_timeout(b, 20 * MS).unwrap().is_none());
    assert!(t0.elapsed() >= 20 * MS);
    assert_eq!(s.stats().tenant(b).unwrap().phase, TenantPhase::Idle);
    g.finish(MS);
    let g = s
        .acquire_timeout(b, Duration::from_secs(1))
        .unwrap()
        .unwrap();
    assert!(g.waited() < Duration::from_secs(1));
    g.finish(MS);
    // An unrepresentable timeout is no timeout.
    s.acquire_timeout(a, Duration::MAX)
        .unwrap()
        .unwrap()
        .finish(MS);
}

#[test]
fn raising_a_cap_live_unblocks_the_tenant() {
    let s = Scheduler::new(SchedConfig {
        cap_window: Duration::from_secs(2),
        ..SchedConfig::new(Policy::Priority { aging: MS })
    })
    .unwrap();
    let t = TenantId(1);
    let capped = TenantParams {
        cap: Some(0.1),
        ..TenantParams::default()
    };
    s.add_tenant(t, capped).unwrap();
    s.acquire(t).unwrap().finish(Duration::from_millis(300));
    let s2 = s.clone();
    let waiter = thread::spawn(move || {
        let t0 = Instant::now();
        s2.acquire(t).unwrap().finish(US);
        t0.elapsed()
    });
    wait_phase(&s, t, TenantPhase::Waiting);
    s.update_tenant(
        t,
        TenantParams {
            cap: None,
            ..capped
        },
    )
    .unwrap();
    let waited = waiter.join().unwrap();
    assert!(waited < Duration::from_secs(1), "{waited:?}");
    assert_eq!(s.stats().tenant(t).unwrap().capped, 1);
}

#[test]
fn invalid_input_is_rejected() {
    let s = sched(Policy::FairShare);
    let t = TenantId(1);
    for w in [0, MAX_WEIGHT + 1, u32::MAX] {
        assert_eq!(
            s.add_tenant(t, weight(w)),
            Err(SchedError::InvalidWeight(w))
        );
    }
    for cap in [f64::NAN, f64::INFINITY, 0.0, -0.1, 1.5] {
        let p = TenantParams {
            cap: Some(cap),
            ..TenantParams::default()
        };
        assert!(matches!(s.add_tenant(t, p), Err(SchedError::InvalidCap(_))));
    }
    s.add_tenant(t, weight(MAX_WEIGHT)).unwrap();
    assert_eq!(
        s.add_tenant(t, TenantParams::default()),
        Err(SchedError::DuplicateTenant(t))
    );
    assert_eq!(
        s.update_tenant(t, weight(0)),
        Err(SchedError::InvalidWeight(0))
    );
    let full = TenantParams {
        cap: Some(1.0),
        ..TenantParams::default()
    };
    s.update_tenant(t, full).unwrap();
    let other = TenantId(2);
    assert_eq!(
        s.update_tenant(other, full),
        Err(SchedError::UnknownTenant(other))
    );
    assert_eq!(
        s.remove_tenant(other).unwrap_err(),
        SchedError::UnknownTenant(other)
    );
    assert_eq!(
        s.record_bytes(other, 1),
        Err(SchedError::UnknownTenant(other))
    );
    assert_eq!(
        s.acquire(other).unwrap_err(),
        SchedError::UnknownTenant(other)
    );
    // One acquire at a time per tenant.
    let g = s.acquire(t).unwrap();
    assert_eq!(s.acquire(t).unwrap_err(), SchedError::Busy(t));
    g.finish(Duration::MAX);
    s.acquire(t).unwrap().finish(Duration::ZERO);
    s.record_bytes(t, u64::MAX).unwrap();
    s.record_bytes(t, u64::MAX).unwrap();
    assert_eq!(s.stats().tenant(t).unwrap().bytes, u64::MAX);

    let bad = |c: SchedConfig| matches!(Scheduler::new(c), Err(SchedError::InvalidConfig(_)));
    let base = SchedConfig::default();
    assert!(bad(SchedConfig::new(Policy::RoundRobin {
        slice: Duration::ZERO
    })));
    assert!(bad(SchedConfig::new(Policy::Priority {
        aging: Duration::ZERO
    })));
    assert!(bad(SchedConfig {
        min_charge: Duration::ZERO,
        ..base
    }));
    assert!(bad(SchedConfig {
        cap_window: US,
        ..base
    }));
    assert!(bad(SchedConfig {
        grace: Duration::from_secs(2),
        ..base
    }));
    assert!(Scheduler::new(SchedConfig {
        grace: Duration::ZERO,
        ..base
    })
    .is_ok());
}

#[test]
fn backlogged_workers_get_weighted_shares_and_slices() {
    let s = sched(Policy::FairShare);
    let ids = [TenantId(1), TenantId(2), TenantId(3)];
    for (id, w) in ids.iter().zip([1, 2, 4]) {
        s.add_tenant(*id, weight(w)).unwrap();
    }
    let workers = ids
        .iter()
        .map(|&id| backlogged_worker(&s, id, 500 * US, None))
        .collect();
    thread::sleep(Duration::from_millis(800));
    let shares = busy_shares(&s, &ids);
    stop(&s, workers);
    eprintln!("fair share 1:2:4, finish_and_acquire: {shares:?}");
    for (share, want) in shares.iter().zip([1.0 / 7.0, 2.0 / 7.0, 4.0 / 7.0]) {
        assert!((share - want).abs() < 0.05, "shares {shares:?}");
    }

    // Round robin: turns of a whole slice, with no grace needed.
    let s = Scheduler::new(SchedConfig {
        grace: Duration::ZERO,
        ..SchedConfig::new(Policy::RoundRobin { slice: 2 * MS })
    })
    .unwrap();
    let log: Log = Arc::default();
    for id in &ids[..2] {
        s.add_tenant(*id, TenantParams::default()).unwrap();
    }
    let workers = ids[..2]
        .iter()
        .map(|&id| backlogged_worker(&s, id, 500 * US, Some(log.clone())))
        .collect();
    thread::sleep(Duration::from_millis(400));
    stop(&s, workers);
    let runs = runs(&log.lock().unwrap());
    let interior = &runs[1..runs.len() - 1];
    let exact = interior.iter().filter(|(_, n)| *n == 4).count();
    assert!(exact * 10 >= interior.len() * 9, "runs {runs:?}");
}

#[test]
fn finish_and_acquire_reports_removal_and_shutdown() {
    let s = sched(Policy::Priority { aging: MS });
    let (a, b) = (TenantId(1), TenantId(2));
    s.add_tenant(a, TenantParams::default()).unwrap();
    s.add_tenant(b, TenantParams::default()).unwrap();
    // Granted again at once when nobody else waits.
    let g = s.acquire(a).unwrap();
    let g = g.finish_and_acquire(MS).unwrap();
    assert_eq!(g.tenant(), a);
    // Removed while holding: the command is still counted.
    s.remove_tenant(a).unwrap();
    assert_eq!(
        g.finish_and_acquire(MS).unwrap_err(),
        SchedError::Removed(a)
    );
    assert_eq!(s.stats().gpu.commands, 2);
    // Re-added under the same id: a grant of the old one does not carry over.
    s.add_tenant(a, TenantParams::default()).unwrap();
    let g = s.acquire(b).unwrap();
    s.remove_tenant(b).unwrap();
    s.add_tenant(b, TenantParams::default()).unwrap();
    assert_eq!(
        g.finish_and_acquire(MS).unwrap_err(),
        SchedError::Removed(b)
    );
    assert_eq!(s.stats().tenant(b).unwrap().phase, TenantPhase::Idle);
    // Waiting for its next command when the scheduler shuts down: b
    // finishes while a waits, so a runs next and b's next request waits.
    let gb = s.acquire(b).unwrap();
    let s2 = s.clone();
    let holder = thread::spawn(move || {
        let g = s2.acquire(a).unwrap();
        thread::sleep(20 * MS);
        g.finish(20 * MS);
    });
    wait_phase(&s, a, TenantPhase::Waiting);
    let next = thread::spawn(move || gb.finish_and_acquire(MS).map(|_| ()));
    wait_phase(&s, b, TenantPhase::Waiting);
    assert_eq!(s.stats().tenant(a).unwrap().phase, TenantPhase::Holding);
    s.shutdown();
    assert_eq!(next.join().unwrap(), Err(SchedError::Shutdown));
    holder.join().unwrap();
}

/// A worker that keeps the GPU for consecutive commands with
/// [`crate::Grant::renew`] while its turn lasts; logs grants (turns).
fn turn_worker(s: &Scheduler, id: TenantId, cmd: Duration, log: Option<Log>) -> JoinHandle<u64> {
    let s = s.clone();
    thread::spawn(move || {
        let mut n = 0;
        while let Ok(mut g) = s.acquire(id) {
            if let Some(log) = &log {
                log.lock().unwrap().push(id);
            }
            loop {
                thread::sleep(cmd);
                n += 1;
                if !g.renew(cmd) {
                    break;
                }
            }
        }
        n
    })
}

fn with_turn(policy: Policy, turn: Duration) -> Scheduler {
    let mut c = SchedConfig::new(policy);
    c.turn = turn;
    Scheduler::new(c).unwrap()
}

#[test]
fn turns_keep_weighted_shares() {
    let s = with_turn(Policy::FairShare, 2 * MS);
    let ids = [TenantId(1), TenantId(2), TenantId(3)];
    for (id, w) in ids.iter().zip([1, 2, 4]) {
        s.add_tenant(*id, weight(w)).unwrap();
    }
    let log: Log = Arc::default();
    let workers = ids
        .iter()
        .map(|&id| turn_worker(&s, id, 200 * US, Some(log.clone())))
        .collect();
    thread::sleep(Duration::from_millis(1500));
    let shares = busy_shares(&s, &ids);
    stop(&s, workers);
    eprintln!("turns 1:2:4: {shares:?}");
    for (share, want) in shares.iter().zip([1.0 / 7.0, 2.0 / 7.0, 4.0 / 7.0]) {
        assert!((share - want).abs() < 0.05, "shares {shares:?}");
    }
    // Turns, not single commands: about 2 ms of 200 µs commands each.
    let log = log.lock().unwrap();
    let commands = s.stats().gpu.commands;
    assert!(
        commands as usize > 4 * log.len(),
        "{commands} commands in {} turns",
        log.len()
    );
}

#[test]
fn renew_keeps_the_gpu_while_nobody_waits() {
    // No turn at all: alone, a tenant still keeps the GPU.
    let s = with_turn(Policy::FairShare, Duration::ZERO);
    let (a, b) = (TenantId(1), TenantId(2));
    s.add_tenant(a, weight(1)).unwrap();
    s.add_tenant(b, weight(1)).unwrap();
    let mut g = s.acquire(a).unwrap();
    for _ in 0..100 {
        assert!(g.renew(10 * US));
    }
    let st = s.stats();
    assert_eq!((st.gpu.grants, st.gpu.commands), (1, 100));
    assert_eq!(st.tenant(a).unwrap().busy, 1000 * US);
    assert_eq!(st.tenant(a).unwrap().phase, TenantPhase::Holding);
    // Someone waits: with no turn, the next renewal hands over.
    let other = thread::spawn({
        let s = s.clone();
        move || s.acquire(b).unwrap().finish(US)
    });
    wait_phase(&s, b, TenantPhase::Waiting);
    assert!(!g.renew(10 * US));
    other.join().unwrap();
    // A spent grant stays spent; dropping it charges nothing more.
    assert!(!g.renew(10 * US));
    drop(g);
    let st = s.stats();
    assert_eq!(st.tenant(a).unwrap().commands, 101);
    assert_eq!(st.tenant(a).unwrap().busy, 1010 * US);
}

#[test]
fn a_turn_ends_after_its_device_time() {
    let s = with_turn(Policy::FairShare, MS);
    let (a, b) = (TenantId(1), TenantId(2));
    s.add_tenant(a, weight(1)).unwrap();
    s.add_tenant(b, weight(1)).unwrap();
    let mut g = s.acquire(a).unwrap();
    let other = thread::spawn({
        let s = s.clone();
        move || s.acquire(b).unwrap().finish(US)
    });
    wait_phase(&s, b, TenantPhase::Waiting);
    // 1 ms of turn: nine 100 µs commands keep it, the tenth ends it.
    for i in 0..9 {
        assert!(g.renew(100 * US), "command {i}");
    }
    assert!(!g.renew(100 * US));
    other.join().unwrap();
}

#[test]
fn a_higher_priority_ends_a_turn_at_once() {
    let s = with_turn(
        Policy::Priority {
            aging: Duration::from_secs(10),
        },
        Duration::from_secs(1),
    );
    let (low, equal, high) = (TenantId(1), TenantId(2), TenantId(3));
    s.add_tenant(low, prio(0)).unwrap();
    s.add_tenant(equal, prio(0)).unwrap();
    s.add_tenant(high, prio(5)).unwrap();
    let mut g = s.acquire(low).unwrap();
    let spawn = |id| {
        let s = s.clone();
        thread::spawn(move || s.acquire(id).unwrap().finish(US))
    };
    // An equal priority waits for the turn to end.
    let e = spawn(equal);
    wait_phase(&s, equal, TenantPhase::Waiting);
    assert!(g.renew(10 * US));
    // A higher one does not.
    let h = spawn(high);
    wait_phase(&s, high, TenantPhase::Waiting);
    assert!(!g.renew(10 * US));
    h.join().unwrap();
    e.join().unwrap();
    assert_eq!(s.stats().tenant(high).unwrap().commands, 1);
}

#[test]
fn a_turn_ends_at_the_cap_and_yield_frees_the_gpu() {
    let s = with_turn(Policy::FairShare, Duration::from_secs(1));
    let (capped, other) = (TenantId(1), TenantId(2));
    s.add_tenant(
        capped,
        TenantParams {
            cap: Some(0.5),
            ..TenantParams::default()
        },
    )
    .unwrap();
    s.add_tenant(other, weight(1)).unwrap();
    // Cap window 100 ms: 50 ms of budget, and even alone it ends there.
    let mut g = s.acquire(capped).unwrap();
    let mut kept = 0;
    while {
        // Device time is charged as wall time just past.
        thread::sleep(5 * MS);
        g.renew(5 * MS)
    } {
        kept += 1;
        assert!(kept < 20, "the cap never ended the turn");
    }
    assert!((8..=10).contains(&kept), "{kept} commands kept the turn");
    // yield_turn releases without a charge.
    let mut g = s.acquire(other).unwrap();
    assert!(g.renew(US));
    let busy = s.stats().tenant(other).unwrap().busy;
    g.yield_turn();
    assert_eq!(s.stats().tenant(other).unwrap().busy, busy);
    assert_eq!(s.stats().tenant(other).unwrap().phase, TenantPhase::Idle);
    s.acquire(other).unwrap().finish(US);
}

#[test]
fn renew_after_remove_or_shutdown_ends_the_turn() {
    let s = with_turn(Policy::FairShare, Duration::from_secs(1));
    let a = TenantId(1);
    s.add_tenant(a, weight(1)).unwrap();
    let mut g = s.acquire(a).unwrap();
    s.remove_tenant(a).unwrap();
    assert!(!g.renew(US));
    s.add_tenant(a, weight(1)).unwrap();
    let mut g = s.acquire(a).unwrap();
    s.shutdown();
    assert!(!g.renew(US));
    assert!(s.stats().gpu.commands >= 2);
}

#[test]
fn turn_config_is_validated() {
    let mut c = SchedConfig::new(Policy::FairShare);
    c.turn = Duration::from_secs(2);
    assert!(matches!(
        Scheduler::new(c),
        Err(SchedError::InvalidConfig(m)) if m.contains("turn")
    ));
}

#[test]
fn acquire_cancellable_keeps_its_place_and_can_be_cancelled() {
    let s = sched(Policy::FairShare);
    let (a, b, c) = (TenantId(1), TenantId(2), TenantId(3));
    for id in [a, b, c] {
        s.add_tenant(id, weight(1)).unwrap();
    }
    let g = s.acquire(a).unwrap();
    // b queues first and polls its cancellation every millisecond; c
    // queues later with a plain acquire. Many polls later b still comes
    // first.
    let polls = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let log: Log = Arc::default();
    let tb = thread::spawn({
        let (s, polls, log) = (s.clone(), polls.clone(), log.clone());
        move || {
            let check = || {
                polls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                false
            };
            let g = s.acquire_cancellable(b, MS, &check).unwrap().unwrap();
            log.lock().unwrap().push(b);
            g.finish(US);
        }
    });
    wait_phase(&s, b, TenantPhase::Waiting);
    let tc = thread::spawn({
        let (s, log) = (s.clone(), log.clone());
        move || {
            let g = s.acquire(c).unwrap();
            log.lock().unwrap().push(c);
            g.finish(US);
        }
    });
    wait_phase(&s, c, TenantPhase::Waiting);
    wait_until("b to poll", || {
        polls.load(std::sync::atomic::Ordering::Relaxed) >= 20
    });
    assert_eq!(s.stats().tenant(b).unwrap().phase, TenantPhase::Waiting);
    g.finish(US);
    tb.join().unwrap();
    tc.join().unwrap();
    assert_eq!(*log.lock().unwrap(), vec![b, c]);

    // Cancelled while waiting: it leaves the queue and the GPU stays usable.
    let g = s.acquire(a).unwrap();
    let flag = Arc::new(AtomicBool::new(false));
    let tb = thread::spawn({
        let (s, flag) = (s.clone(), flag.clone());
        move || s.acquire_cancellable(b, MS, &|| flag.load(std::sync::atomic::Ordering::Relaxed))
    });
    wait_phase(&s, b, TenantPhase::Waiting);
    flag.store(true, std::sync::atomic::Ordering::Relaxed);
    assert!(tb.join().unwrap().unwrap().is_none());
    assert_eq!(s.stats().tenant(b).unwrap().phase, TenantPhase::Idle);
    g.finish(US);
    s.acquire(b).unwrap().finish(US);
    // Unknown tenants are refused up front.
    assert!(matches!(
        s.acquire_cancellable(TenantId(9), MS, &|| false),
        Err(SchedError::UnknownTenant(_))
    ));
}

#[test]
fn renew_or_queue_keeps_the_tenant_queued() {
    let s = with_turn(Policy::FairShare, Duration::ZERO);
    let (a, b) = (TenantId(1), TenantId(2));
    s.add_tenant(a, weight(1)).unwrap();
    s.add_tenant(b, weight(1)).unwrap();
    let mut g = s.acquire(a).unwrap();
    let other = thread::spawn({
        let s = s.clone();
        move || {
            let g = s.acquire(b).unwrap();
            thread::sleep(5 * MS);
            g.finish(5 * MS);
        }
    });
    wait_phase(&s, b, TenantPhase::Waiting);
    // The turn ends; a is queued behind b at once, with no thread asking.
    assert!(!g.renew_or_queue(US));
    assert_eq!(s.stats().tenant(a).unwrap().phase, TenantPhase::Waiting);
    // A plain acquire sees it busy.
    assert!(matches!(s.acquire(a), Err(SchedError::Busy(_))));
    // b finishes: a is granted the GPU with no thread asking yet, and
    // acquire_cancellable takes that grant up.
    other.join().unwrap();
    assert_eq!(s.stats().tenant(a).unwrap().phase, TenantPhase::Holding);
    let g = s.acquire_cancellable(a, MS, &|| false).unwrap().unwrap();
    assert!(g.waited() >= 4 * MS, "waited {:?}", g.waited());
    g.finish(US);
    // Queued and then without work: dequeue.
    let mut g = s.acquire(a).unwrap();
    let other = thread::spawn({
        let s = s.clone();
        move || s.acquire(b).unwrap().finish(US)
    });
    wait_phase(&s, b, TenantPhase::Waiting);
    assert!(!g.renew_or_queue(US));
    // Queued, or already granted the GPU again (the policy may prefer it
    // to b): either way dequeue leaves it idle and the GPU free for b,
    // with nothing charged.
    let commands = s.stats().tenant(a).unwrap().commands;
    s.dequeue(a);
    other.join().unwrap();
    let st = s.stats();
    assert_eq!(st.tenant(a).unwrap().phase, TenantPhase::Idle);
    assert_eq!(st.tenant(a).unwrap().commands, commands);
    s.acquire(b).unwrap().finish(US);
    s.dequeue(TenantId(9));
}

#[test]
fn recent_load_follows_device_time_and_decays() {
    let s = sched(Policy::FairShare);
    s.add_tenant(TenantId(1), weight(1)).unwrap();
    assert_eq!(s.stats().gpu.recent_load, 0.0);
    // 5 s of device time reported now: half the window's worth.
    for _ in 0..5 {
        s.acquire(TenantId(1))
            .unwrap()
            .finish(Duration::from_secs(1));
    }
    let load = s.stats().gpu.recent_load;
    assert!((0.4..=0.5).contains(&load), "{load}");
    // It decays with wall time, and never passes 1.
    thread::sleep(Duration::from_millis(300));
    let later = s.stats().gpu.recent_load;
    assert!(later < load, "{later} after {load}");
    for _ in 0..30 {
        s.acquire(TenantId(1))
            .unwrap()
            .finish(Duration::from_secs(1));
    }
    assert_eq!(s.stats().gpu.recent_load, 1.0);
}
