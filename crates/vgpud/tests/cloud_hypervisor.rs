//! cloud-hypervisor (`--user-device socket=...`) against `vgpud run`,
//! played message for message by `vgpu_testkit::ch` on the `vfio_user`
//! client it pins: device creation, the extended-capability read at 0x100,
//! BAR sizing and sparse mmaps, INTx at once, MSI-X in two batches, a guest
//! driver's flow on INTx and on MSI-X vector 16, guest ECAM reads of the
//! extended config space, narrow and unaligned BAR accesses, reboots as
//! immediate reconnects, and eject.
//!
//! cloud-hypervisor ignores a reply's error flag, so an error reply to any
//! of these requests leaves it (and here the VMM thread) waiting forever:
//! every step runs behind a watchdog, and a step that hangs fails the test.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use vgpu_testkit::abi;
use vgpu_testkit::ch::{wait_eventfd, ChDevice, ChGuest, GuestRam, Vmm};
use vmm_sys_util::tempdir::TempDir;

/// Longest any single cloud-hypervisor step may take on a loaded machine.
const WATCHDOG: Duration = Duration::from_secs(20);
/// Longest wait for an interrupt that must come.
const IRQ_WAIT: Duration = Duration::from_secs(10);
/// Guest RAM: one region below 4 GiB and one above, as a VM with more
/// than 3 GiB gets (smaller here).
const RAM_LAYOUT: [(u64, u64); 2] = [(0, 16 << 20), (0x1_0000_0000, 16 << 20)];
/// The driver's rings and buffers live in the region above 4 GiB.
const DRIVER_REGION: usize = 1;
/// Reboots in a row.
const REBOOTS: usize = 20;

/// `vgpud run` with one software vGPU, killed on drop.
struct Vgpud {
    child: Child,
    socket: PathBuf,
    api: PathBuf,
    _dir: TempDir,
}

impl Vgpud {
    fn start() -> Vgpud {
        let dir = TempDir::new_with_prefix("/tmp/vgpud-ch-").unwrap();
        let run = dir.as_path().join("run");
        let config = dir.as_path().join("vgpud.toml");
        std::fs::write(
            &config,
            format!(
                r#"
[daemon]
runtime_dir = "{}"
metrics_address = ""

[[gpu]]
name = "gpu0"
backend = "software"
memory = "256MiB"
compute_units = 2

[[vgpu]]
name = "vgpu0"
gpu = "gpu0"
socket = "vgpu0.sock"
memory = "64MiB"
compute_units = 1
"#,
                run.display()
            ),
        )
        .unwrap();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_vgpud"));
        cmd.arg("run").arg("--config").arg(&config);
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            cmd.arg("--allow-root");
        }
        let mut child = cmd
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                eprintln!("vgpud: {line}");
            }
        });
        let socket = run.join("vgpu0.sock");
        let api = run.join("api.sock");
        let deadline = Instant::now() + Duration::from_secs(30);
        while !(socket.exists() && api.exists()) {
            assert!(child.try_wait().unwrap().is_none(), "vgpud exited");
            assert!(
                Instant::now() < deadline,
                "vgpud did not create its sockets"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Vgpud {
            child,
            socket,
            api,
            _dir: dir,
        }
    }

    /// The vGPU's figures from the management API.
    fn stats(&self) -> serde_json::Value {
        let mut s = UnixStream::connect(&self.api).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        s.write_all(b"GET /api/v1/vgpus/vgpu0 HTTP/1.1\r\nHost: localhost\r\n\r\n")
            .unwrap();
        let mut resp = Vec::new();
        s.read_to_end(&mut resp).unwrap();
        let end = resp.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
        let v: serde_json::Value = serde_json::from_slice(&resp[end + 4..]).unwrap();
        v["stats"].clone()
    }
}

impl Drop for Vgpud {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Creates the device as cloud-hypervisor does, on the VMM thread.
fn create(vmm: &Vmm, socket: &Path, ram: &GuestRam) {
    let socket = socket.to_path_buf();
    let ram = ram.share();
    vmm.step("device creation", move |d| {
        *d = Some(ChDevice::create(&socket, &ram).expect("device creation"));
    });
}

/// What the guest's PCI core and driver do before using the device:
/// reads the header, turns on memory decoding and bus mastering.
fn enumerate(vmm: &Vmm) -> u32 {
    vmm.on("enumeration", |d| {
        let ids = d.read_config_register(0);
        for reg in 1..64 {
            d.read_config_register(reg);
        }
        d.write_config_register(1, 0, &0x0006u16.to_le_bytes())
            .unwrap();
        ids
    })
}

/// The guest enables MSI-X through the capability's message control.
fn enable_msix(vmm: &Vmm) {
    vmm.on("MSI-X enable", |d| {
        let cap = d.msix_cap_offset().expect("an MSI-X capability") as usize;
        let ctl = (d.read_config_register(cap / 4) >> 16) as u16;
        d.write_config_register(cap / 4, 2, &(ctl | 1 << 15).to_le_bytes())
            .unwrap();
        assert!(!d.intx_in_use(), "enabling MSI-X turns INTx off");
        assert!(d.msix_eventfd(16).is_some(), "17 vectors set up");
    });
}

/// The guest's driver, used from the VMM thread (its accesses trap there).
type Driver = Arc<Mutex<ChGuest>>;

fn driver(ram: &GuestRam) -> Driver {
    Arc::new(Mutex::new(ChGuest::new(ram, DRIVER_REGION)))
}

/// Enables the device and queue `q` with MSI-X `vector`.
fn setup_queue(vmm: &Vmm, guest: &Driver, q: u32, vector: u32) {
    let g = guest.clone();
    vmm.on("queue setup", move |d| {
        let mut g = g.lock().unwrap();
        g.write32(d, abi::REG_CONTROL, abi::CONTROL_ENABLE);
        let status = g.setup_queue(d, q, 64, vector);
        assert_ne!(status & abi::QSTATUS_ENABLED, 0, "queue {q}: {status:#x}");
    });
}

/// A FENCE on queue `q` with an interrupt, answered on `vector`'s eventfd
/// (`None`: INTx).
fn fence_irq(vmm: &Vmm, guest: &Driver, q: u32, value: u64, vector: Option<usize>) {
    let g = guest.clone();
    vmm.on("FENCE with interrupt", move |d| {
        let mut g = g.lock().unwrap();
        let addr = g.fence(d, q, value, true);
        let efd = match vector {
            Some(v) => d.msix_eventfd(v).expect("MSI-X vector"),
            None => d.intx_eventfd().expect("INTx"),
        };
        assert!(wait_eventfd(efd, IRQ_WAIT), "no interrupt ({vector:?})");
        let used = g.wait_used(q, IRQ_WAIT).expect("a completion");
        assert_eq!(used.completion().status, abi::STATUS_OK);
        let mut b = [0u8; 8];
        g.ram().read_into(addr, &mut b);
        assert_eq!(u64::from_le_bytes(b), value, "the fence wrote guest RAM");
        // The interrupt handler: read the cause, acknowledge it.
        let cause = g.read32(d, abi::REG_IRQ_CAUSE);
        assert_ne!(cause & abi::IRQ_CAUSE_QUEUE, 0, "cause {cause:#x}");
        g.write32(d, abi::REG_IRQ_CAUSE, cause);
    });
}

#[test]
fn test_cloud_hypervisor_creates_drives_and_ejects_a_vgpu() {
    let vgpud = Vgpud::start();
    let ram = GuestRam::new(&RAM_LAYOUT);
    let vmm = Vmm::new(WATCHDOG);
    create(&vmm, &vgpud.socket, &ram);
    let created = vmm.on("created", |d| {
        (
            d.sent,
            d.intx_in_use(),
            d.bar_base(abi::BAR_REGS),
            d.bar_base(abi::BAR_WINDOW),
            d.mapped(abi::BAR_REGS, abi::DOORBELL_OFFSET)
                .map(|m| m.size()),
            d.mapped(abi::BAR_WINDOW, 0).map(|m| m.size()),
            d.mapped(abi::BAR_REGS, 0).is_some(),
        )
    });
    let (sent, intx, bar0, bar2, doorbells, window, regs_mapped) = created;
    assert!(sent.config_reads > 0);
    assert!(intx, "cloud-hypervisor turns INTx on at creation");
    assert!(bar0.is_some() && bar2.is_some(), "BARs sized and placed");
    assert_eq!(doorbells, Some(abi::DOORBELL_SIZE as usize));
    assert!(
        window.is_some_and(|w| w >= 4096),
        "the window is mapped whole"
    );
    assert!(!regs_mapped, "registers stay trapped");

    let ids = enumerate(&vmm);
    assert_eq!(
        ids,
        u32::from(abi::PCI_VENDOR_ID) | u32::from(abi::PCI_DEVICE_ID) << 16
    );

    // Guest ECAM accesses to the extended config space: every dword reads
    // as an empty capability list, and writes there change nothing.
    let ext = vmm.on("ECAM reads of 0x100-0xfff", |d| {
        d.write_config_register(0x40, 0, &[0xff; 4]).unwrap();
        d.write_config_register(0x3ff, 2, &[0xff; 2]).unwrap();
        (0x40..0x400)
            .map(|r| d.read_config_register(r))
            .filter(|v| *v != 0)
            .count()
    });
    assert_eq!(ext, 0, "nonzero dwords in the extended config space");

    // Narrow and unaligned BAR0 accesses, each followed by an INTx
    // unmask while INTx is on.
    let before = vgpud.stats();
    let narrow = vmm.on("narrow BAR0 accesses", |d| {
        let unmasks = d.sent.intx_unmasks;
        let bar0 = d.bar_base(abi::BAR_REGS).unwrap();
        let magic = abi::ABI_MAGIC.to_le_bytes();
        let mut one = [0u8; 1];
        d.read_bar(bar0 + abi::REG_MAGIC + 1, &mut one);
        let mut two = [0u8; 2];
        d.read_bar(bar0 + abi::REG_MAGIC + 2, &mut two);
        let mut straddle = [0u8; 4];
        d.read_bar(bar0 + abi::REG_MAGIC + 2, &mut straddle);
        let mut version = [0u8; 4];
        d.read_bar(bar0 + abi::REG_VERSION, &mut version);
        // A byte write to CONTROL is dropped: the device stays disabled.
        d.write_bar(bar0 + abi::REG_CONTROL, &[1]);
        d.write_bar(bar0 + abi::REG_CONTROL + 1, &[1, 0]);
        let mut control = [0u8; 4];
        d.read_bar(bar0 + abi::REG_CONTROL, &mut control);
        assert_eq!(one[0], magic[1]);
        assert_eq!(two, [magic[2], magic[3]]);
        assert_eq!(straddle, [magic[2], magic[3], version[0], version[1]]);
        assert_eq!(u32::from_le_bytes(control), 0, "narrow writes dropped");
        d.sent.intx_unmasks - unmasks
    });
    assert_eq!(narrow, 7, "an unmask after each of the 7 trapped accesses");
    let after = vgpud.stats();
    let delta = |k: &str| after[k].as_u64().unwrap() - before[k].as_u64().unwrap();
    assert_eq!(delta("odd_reads"), 3, "{after}");
    assert_eq!(delta("dropped_writes"), 2, "{after}");

    // The driver on INTx alone: its completions interrupt it, twice (the
    // level-triggered line unmasked by the accesses in between).
    let guest = driver(&ram);
    setup_queue(&vmm, &guest, 0, 1);
    fence_irq(&vmm, &guest, 0, 0x1111, None);
    fence_irq(&vmm, &guest, 0, 0x2222, None);

    // MSI-X: INTx off, 16 + 1 eventfds; queue 1 completes on vector 16.
    enable_msix(&vmm);
    setup_queue(&vmm, &guest, 1, 16);
    fence_irq(&vmm, &guest, 1, 0x3333, Some(16));
    let unmasks = vmm.on("BAR accesses with MSI-X on", |d| {
        let before = d.sent.intx_unmasks;
        let bar0 = d.bar_base(abi::BAR_REGS).unwrap();
        let mut b = [0u8; 2];
        d.read_bar(bar0 + abi::REG_STATUS + 1, &mut b);
        d.sent.intx_unmasks - before
    });
    assert_eq!(unmasks, 0, "no INTx unmasks once MSI-X is on");

    // Eject: DMA_UNMAP per region, MSI-X off, the socket shut. The vGPU
    // then serves the next VMM on a reset device.
    vmm.step("eject", |d| d.take().expect("device").eject());
    create(&vmm, &vgpud.socket, &ram);
    let status = vmm.on("after eject", |d| {
        let mut b = [0u8; 4];
        let bar0 = d.bar_base(abi::BAR_REGS).unwrap();
        d.read_bar(bar0 + abi::queue_reg(1, abi::QREG_STATUS), &mut b);
        u32::from_le_bytes(b)
    });
    assert_eq!(status, 0, "the next VMM finds a reset device");
    assert_eq!(vgpud.stats()["resets"].as_u64().map(|r| r >= 1), Some(true));
}

#[test]
fn test_cloud_hypervisor_reboots_are_served_at_once() {
    let vgpud = Vgpud::start();
    let ram = GuestRam::new(&RAM_LAYOUT);
    let vmm = Vmm::new(WATCHDOG);
    create(&vmm, &vgpud.socket, &ram);
    let mut times = Vec::new();
    for i in 0..REBOOTS {
        enumerate(&vmm);
        enable_msix(&vmm);
        // A fresh driver after each boot, its rings where the last one's were.
        let guest = driver(&ram);
        setup_queue(&vmm, &guest, 0, 16);
        fence_irq(&vmm, &guest, 0, i as u64 + 1, Some(16));
        // A reboot: the old device goes (MSI-X off, socket shut) and the
        // new one connects at once, with no retry.
        let socket = vgpud.socket.clone();
        let shared = ram.share();
        let took = vmm.step("reboot", move |d| {
            let begun = Instant::now();
            drop(d.take());
            *d = Some(ChDevice::create(&socket, &shared).expect("reconnect"));
            begun.elapsed()
        });
        times.push(took);
    }
    times.sort();
    eprintln!(
        "{REBOOTS} reconnects: min {:?}, median {:?}, max {:?}",
        times[0],
        times[times.len() / 2],
        times[times.len() - 1]
    );
    let resets = vgpud.stats()["resets"].as_u64().unwrap();
    assert!(
        resets >= REBOOTS as u64,
        "each reboot reset the device: {resets}"
    );
}
