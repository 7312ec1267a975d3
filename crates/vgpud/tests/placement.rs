//! vGPUs created with `gpu = "auto"` on a daemon of four software GPUs:
//! where each policy puts them, a busy GPU passed over, and a refusal
//! that says why when no GPU has room. The load comes from a real client
//! on a vGPU's socket.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use vgpud::config::{Config, VgpuConfig};
use vgpud::daemon::{Daemon, DaemonError};
use vmm_sys_util::tempdir::TempDir;

/// A daemon with `gpus` software GPUs of 1 GiB and 8 compute units,
/// placing by `placement`, with the vGPUs of `vgpus` (TOML) created.
fn daemon(placement: &str, gpus: usize, vgpus: &str) -> (Daemon, TempDir) {
    let dir = TempDir::new_with_prefix("/tmp/vgpud-placement-").unwrap();
    let mut text = format!(
        "[daemon]\nruntime_dir = \"{}\"\nmetrics_address = \"\"\nplacement = \"{placement}\"\n",
        dir.as_path().display()
    );
    for i in 0..gpus {
        text += &format!(
            "\n[[gpu]]\nname = \"gpu{i}\"\nbackend = \"software\"\nmemory = \"1GiB\"\ncompute_units = 8\n"
        );
    }
    text += vgpus;
    let mut d = Daemon::new(Config::parse(&text, "test.toml").unwrap()).unwrap();
    d.start_all().unwrap();
    (d, dir)
}

fn vgpu(name: &str, gpu: &str, memory: &str) -> VgpuConfig {
    let text = format!(
        "[[gpu]]\nname = \"g\"\nbackend = \"software\"\nmemory = \"1GiB\"\ncompute_units = 8\n\
         [[vgpu]]\nname = \"{name}\"\ngpu = \"g\"\nsocket = \"{name}.sock\"\nmemory = \"{memory}\"\ncompute_units = 1\n"
    );
    let mut v = Config::parse(&text, "v.toml").unwrap().vgpus.remove(0);
    v.gpu = gpu.into();
    v
}

/// Where each vGPU went, by name.
fn gpu_of(d: &Daemon, name: &str) -> String {
    d.instance(name).unwrap().config.gpu
}

#[test]
fn spread_balances_the_gpus() {
    let (mut d, _dir) = daemon("spread", 4, "");
    for i in 0..8 {
        d.create(vgpu(&format!("v{i}"), "auto", "256MiB")).unwrap();
    }
    for g in 0..4 {
        let on: Vec<String> = d
            .list()
            .into_iter()
            .filter(|i| i.config.gpu == format!("gpu{g}"))
            .map(|i| i.config.name)
            .collect();
        // Two each, in turn: v0 and v4 on gpu0, v1 and v5 on gpu1...
        assert_eq!(on, [format!("v{g}"), format!("v{}", g + 4)], "gpu{g}");
    }
    let why = d.instance("v5").unwrap().placed.unwrap();
    assert!(
        why.starts_with("spread: recent load 0.00, 768MiB of 1GiB"),
        "{why}"
    );
    // A vGPU that names its GPU is not placed.
    d.create(vgpu("named", "gpu0", "64MiB")).unwrap();
    assert_eq!(gpu_of(&d, "named"), "gpu0");
    assert!(d.instance("named").unwrap().placed.is_none());
}

#[test]
fn pack_fills_the_gpus_in_order() {
    let (mut d, _dir) = daemon("pack", 4, "");
    for i in 0..6 {
        d.create(vgpu(&format!("v{i}"), "auto", "256MiB")).unwrap();
    }
    let gpus: Vec<String> = (0..6).map(|i| gpu_of(&d, &format!("v{i}"))).collect();
    assert_eq!(gpus, ["gpu0", "gpu0", "gpu0", "gpu0", "gpu1", "gpu1"]);
    // A large one goes where it fits, past the full and half-full ones.
    d.create(vgpu("big", "auto", "768MiB")).unwrap();
    assert_eq!(gpu_of(&d, "big"), "gpu2");
}

#[test]
fn no_room_anywhere_is_refused_with_each_gpus_reason() {
    let (mut d, _dir) = daemon("spread", 2, "");
    d.create(vgpu("a", "auto", "768MiB")).unwrap();
    d.create(vgpu("b", "auto", "512MiB")).unwrap();
    assert_eq!(
        (gpu_of(&d, "a"), gpu_of(&d, "b")),
        ("gpu0".into(), "gpu1".into())
    );
    let e = d.create(vgpu("c", "auto", "768MiB")).unwrap_err();
    let DaemonError::DoesNotFit { gpu, message, .. } = &e else {
        panic!("{e}")
    };
    assert_eq!(gpu, "auto");
    assert!(message.starts_with("no GPU has room"), "{message}");
    for want in [
        "gpu0: recent load 0.00, 256MiB of 1GiB",
        "gpu1: recent load 0.00, 512MiB of 1GiB",
    ] {
        assert!(message.contains(want), "{want} not in {message}");
    }
    assert!(d.instance("c").is_none());
    // What does fit still goes in.
    d.create(vgpu("c", "auto", "512MiB")).unwrap();
    assert_eq!(gpu_of(&d, "c"), "gpu1");
}

fn recent_load(d: &Daemon, gpu: &str) -> f64 {
    d.stats()
        .0
        .into_iter()
        .find(|g| g.name == gpu)
        .unwrap()
        .recent_load
}

#[test]
fn spread_passes_over_a_busy_gpu() {
    let vgpus = "\n[[vgpu]]\nname = \"busy\"\ngpu = \"gpu0\"\nsocket = \"busy.sock\"\nmemory = \"256MiB\"\ncompute_units = 1\n\
                 \n[[vgpu]]\nname = \"idle\"\ngpu = \"gpu1\"\nsocket = \"idle.sock\"\nmemory = \"256MiB\"\ncompute_units = 1\n";
    let (mut d, dir) = daemon("spread", 2, vgpus);
    // Two GPUs alike but for the load: without it, the tie goes to gpu0.
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let guest = common::busy_guest(
        dir.as_path().join("busy.sock"),
        16 << 20,
        stop.clone(),
        done,
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    while recent_load(&d, "gpu0") < 0.05 {
        assert!(Instant::now() < deadline, "gpu0 never got busy");
        std::thread::sleep(Duration::from_millis(50));
    }
    d.create(vgpu("new", "auto", "256MiB")).unwrap();
    stop.store(true, Ordering::Relaxed);
    guest.join().unwrap();
    assert_eq!(recent_load(&d, "gpu1"), 0.0);
    assert_eq!(gpu_of(&d, "new"), "gpu1");
    let why = d.instance("new").unwrap().placed.unwrap();
    assert!(why.starts_with("spread: recent load 0.00"), "{why}");
}
