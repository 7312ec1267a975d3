mod common;
use std::time::{Duration, Instant};
use common::{assert_status, vgpu, MIB};
use vgpu_testkit::abi::{self, ByteValued};
use vgpu_testkit::{launch_cmd, Chain, Mode};

fn thread_cpu(name: &str) -> Duration {
    let mut total = 0u64;
    for e in std::fs::read_dir("/proc/self/task").unwrap() {
        let p = e.unwrap().path();
        let comm = std::fs::read_to_string(p.join("comm")).unwrap_or_default();
        if comm.trim() == name {
            let stat = std::fs::read_to_string(p.join("stat")).unwrap();
            let rest = &stat[stat.rfind(')').unwrap() + 2..];
            let f: Vec<&str> = rest.split(' ').collect();
            total += f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
        }
    }
    Duration::from_millis(total * 10)
}

#[test]
fn probe_sgemm() {
    let (_s, mut g) = vgpu(2);
    g.setup_queue(0, 64, Mode::Interrupt);
    let dim = 256u32;
    let bytes = u64::from(dim * dim * 4);
    let m: Vec<u64> = (0..3).map(|_| g.device_alloc(0, bytes)).collect();
    let p = abi::SgemmParams { c: m[2], a: m[0], b: m[1], m: dim, n: dim, k: dim, reserved: 0, alpha: 1.0, beta: 0.0 };
    let cmd = launch_cmd("sgemm_f32", [1, 1, 1], [256, 1, 1], 48);
    let chain = Chain::command(&cmd).bytes(p.as_slice()).completion();
    for _ in 0..3 {
        let t = Instant::now();
        assert_status(g.run(0, &chain), abi::STATUS_OK);
        eprintln!("sgemm 256: {:?}", t.elapsed());
    }
    let _ = MIB;
}

#[test]
fn probe_disabled_spin() {
    let (_s, mut g) = vgpu(2);
    g.setup_queue(0, 64, Mode::Interrupt);
    assert_status(g.nop(0), abi::STATUS_OK);
    std::thread::sleep(Duration::from_millis(100));
    let c0 = thread_cpu("vgpu-test");
    std::thread::sleep(Duration::from_millis(500));
    let c1 = thread_cpu("vgpu-test");
    eprintln!("idle: {:?}", c1 - c0);
    g.write32(abi::REG_CONTROL, 0);
    let chain = Chain::command(&abi::CmdHeader::default()).completion();
    g.post(0, &chain);
    g.kick(0);
    g.write32(abi::REG_WAKE, 0);
    std::thread::sleep(Duration::from_millis(50));
    let c0 = thread_cpu("vgpu-test");
    std::thread::sleep(Duration::from_millis(500));
    let c1 = thread_cpu("vgpu-test");
    eprintln!("disabled with pending work: {:?}", c1 - c0);
}
