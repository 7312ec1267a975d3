//! Writes the seed corpora under `fuzz/corpus/<target>/`: real messages
//! of each format, encoded with the project's own types (vfio-user
//! headers, the guest ABI's command structures), in the input layout each
//! fuzz target documents.
//!
//! ```text
//! cd fuzz && cargo run --example make_seeds
//! ```
//!
//! Files are overwritten; files of other names are left alone.

use std::fs;
use std::path::{Path, PathBuf};

use vfio_user_server::proto::{Header, FLAG_NO_REPLY, FLAG_TYPE_COMMAND, FLAG_TYPE_REPLY};
use vfio_user_server::sample::regs;
use vgpu_abi::{self as abi, ByteValued};

fn corpus(target: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("corpus")
        .join(target);
    fs::create_dir_all(&dir).expect("corpus directory");
    dir
}

fn seed(target: &str, name: &str, data: &[u8]) {
    fs::write(corpus(target).join(name), data).expect("write seed");
}

// ---- vfio-user ----------------------------------------------------------

const VERSION: u16 = 1;
const DMA_MAP: u16 = 2;
const DMA_UNMAP: u16 = 3;
const DEVICE_GET_INFO: u16 = 4;
const DEVICE_GET_REGION_INFO: u16 = 5;
const DEVICE_GET_REGION_IO_FDS: u16 = 6;
const DEVICE_GET_IRQ_INFO: u16 = 7;
const DEVICE_SET_IRQS: u16 = 8;
const REGION_READ: u16 = 9;
const REGION_WRITE: u16 = 10;
const DMA_READ: u16 = 11;
const DEVICE_RESET: u16 = 13;
const REGION_WRITE_MULTI: u16 = 15;

/// Capabilities as QEMU's vfio-user client sends them.
const QEMU_CAPS: &str = r#"{"capabilities":{"max_msg_fds":16,"max_data_xfer_size":1048576,"pgsizes":4096,"max_dma_maps":65535,"migration":{"pgsize":4096,"max_bitmap_size":1048576},"write_multiple":true}}"#;
/// Capabilities as the `vfio_user` crate (cloud-hypervisor) sends them.
const CH_CAPS: &str = r#"{"capabilities":{"max_msg_fds":1,"max_data_xfer_size":1048576,"migration":{"pgsize":4096}}}"#;

/// A client's byte stream, built message by message.
#[derive(Default)]
struct Stream {
    bytes: Vec<u8>,
    next_id: u16,
}

impl Stream {
    fn msg_flags(&mut self, command: u16, flags: u32, payload: &[u8]) -> &mut Self {
        let header = Header {
            msg_id: self.next_id,
            command,
            msg_size: (16 + payload.len()) as u32,
            flags,
            error: 0,
        };
        self.next_id = self.next_id.wrapping_add(1);
        self.bytes.extend_from_slice(&header.encode());
        self.bytes.extend_from_slice(payload);
        self
    }

    fn msg(&mut self, command: u16, payload: &[u8]) -> &mut Self {
        self.msg_flags(command, FLAG_TYPE_COMMAND, payload)
    }

    fn version(&mut self, caps: &str) -> &mut Self {
        let mut p = 0u16.to_le_bytes().to_vec();
        p.extend_from_slice(&0u16.to_le_bytes());
        p.extend_from_slice(caps.as_bytes());
        p.push(0);
        self.msg(VERSION, &p)
    }

    /// argsz, flags 0, index: the shape of the *_INFO requests.
    fn info(&mut self, command: u16, argsz: u32, index: u32) -> &mut Self {
        self.msg(command, &le32(&[argsz, 0, index, 0]))
    }

    fn region_read(&mut self, region: u32, offset: u64, count: u32) -> &mut Self {
        let mut p = offset.to_le_bytes().to_vec();
        p.extend_from_slice(&le32(&[region, count]));
        self.msg(REGION_READ, &p)
    }

    fn region_write(&mut self, region: u32, offset: u64, data: &[u8]) -> &mut Self {
        let mut p = offset.to_le_bytes().to_vec();
        p.extend_from_slice(&le32(&[region, data.len() as u32]));
        p.extend_from_slice(data);
        self.msg(REGION_WRITE, &p)
    }

    fn reg(&mut self, offset: u64, value: u32) -> &mut Self {
        self.region_write(0, offset, &value.to_le_bytes())
    }

    fn dma_map(&mut self, flags: u32, offset: u64, iova: u64, size: u64) -> &mut Self {
        let mut p = le32(&[32, flags]);
        for v in [offset, iova, size] {
            p.extend_from_slice(&v.to_le_bytes());
        }
        self.msg(DMA_MAP, &p)
    }

    fn dma_unmap(&mut self, flags: u32, iova: u64, size: u64) -> &mut Self {
        let mut p = le32(&[24, flags]);
        p.extend_from_slice(&iova.to_le_bytes());
        p.extend_from_slice(&size.to_le_bytes());
        self.msg(DMA_UNMAP, &p)
    }

    fn set_irqs(
        &mut self,
        flags: u32,
        index: u32,
        start: u32,
        count: u32,
        data: &[u8],
    ) -> &mut Self {
        let mut p = le32(&[20 + data.len() as u32, flags, index, start, count]);
        p.extend_from_slice(data);
        self.msg(DEVICE_SET_IRQS, &p)
    }

    /// The target's input: fd count, fd kinds, the message carrying them.
    fn input(&self, fds: u8, kinds: u8, fd_message: u8) -> Vec<u8> {
        let mut v = vec![fds, kinds, fd_message];
        v.extend_from_slice(&self.bytes);
        v
    }
}

fn le32(values: &[u32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

const SET_DATA_NONE: u32 = 1 << 0;
const SET_DATA_BOOL: u32 = 1 << 1;
const SET_DATA_EVENTFD: u32 = 1 << 2;
const SET_ACTION_MASK: u32 = 1 << 3;
const SET_ACTION_UNMASK: u32 = 1 << 4;
const SET_ACTION_TRIGGER: u32 = 1 << 5;
const IRQ_INTX: u32 = 0;
const IRQ_MSIX: u32 = 2;
const RW: u32 = 3;

fn vfio_user_seeds() {
    const T: &str = "vfio_user_messages";
    // What a VMM asks first: version, device, regions, interrupts.
    let mut s = Stream::default();
    s.version(QEMU_CAPS).info(DEVICE_GET_INFO, 16, 0);
    for r in 0..9 {
        s.info(DEVICE_GET_REGION_INFO, 32, r);
    }
    s.info(DEVICE_GET_REGION_INFO, 80, 2);
    for i in 0..5 {
        s.info(DEVICE_GET_IRQ_INFO, 16, i);
    }
    s.region_read(7, 0, 64).region_read(0, regs::ID, 4);
    seed(T, "probe", &s.input(0, 0, 0));

    // Guest RAM shared by memfd, then the device copies it both ways.
    let mut s = Stream::default();
    s.version(QEMU_CAPS)
        .dma_map(RW, 0, 0x10_0000, 0x1_0000)
        .reg(regs::DMA_ADDR_LO, 0x10_0000)
        .reg(regs::DMA_ADDR_HI, 0)
        .reg(regs::DMA_LEN, 4096)
        .reg(regs::DMA_CMD, 1)
        .region_read(0, regs::DMA_STATUS, 4)
        .region_read(0, regs::BAR2_SUM, 4)
        .reg(regs::DMA_CMD, 2)
        .region_read(0, regs::DMA_STATUS, 4)
        .dma_unmap(0, 0x10_0000, 0x1_0000)
        .dma_unmap(2, 0, 0);
    seed(T, "dma_map_fd", &s.input(1, 0xff, 1));

    // Memory without an fd: the server must ask the client (DMA_READ).
    let mut s = Stream::default();
    s.version(CH_CAPS)
        .dma_map(RW, 0, 0x20_0000, 0x1000)
        .reg(regs::DMA_ADDR_LO, 0x20_0000)
        .reg(regs::DMA_LEN, 64)
        .reg(regs::DMA_CMD, 1)
        .region_read(0, regs::DMA_STATUS, 4);
    seed(T, "dma_map_remote", &s.input(0, 0, 0));

    // Interrupts: MSI-X eventfds, raised, masked; INTx.
    let mut s = Stream::default();
    s.version(QEMU_CAPS)
        .set_irqs(SET_DATA_EVENTFD | SET_ACTION_TRIGGER, IRQ_MSIX, 0, 2, &[])
        .reg(regs::IRQ, 1)
        .set_irqs(SET_DATA_NONE | SET_ACTION_MASK, IRQ_MSIX, 0, 1, &[])
        .set_irqs(SET_DATA_BOOL | SET_ACTION_UNMASK, IRQ_MSIX, 0, 2, &[1, 0])
        .set_irqs(SET_DATA_NONE | SET_ACTION_TRIGGER, IRQ_MSIX, 0, 0, &[])
        .set_irqs(SET_DATA_EVENTFD | SET_ACTION_TRIGGER, IRQ_INTX, 0, 1, &[])
        .reg(regs::IRQ, 0);
    seed(T, "irqs", &s.input(2, 0, 1));

    // Doorbell ioeventfds, several writes in one message, scratch, reset.
    let mut s = Stream::default();
    s.version(QEMU_CAPS).info(DEVICE_GET_REGION_IO_FDS, 16, 0);
    s.info(DEVICE_GET_REGION_IO_FDS, 256, 0);
    let mut multi = 2u64.to_le_bytes().to_vec();
    for (off, v) in [(regs::SCRATCH, 0x1234_5678u64), (regs::DOORBELL, 1)] {
        multi.extend_from_slice(&off.to_le_bytes());
        multi.extend_from_slice(&le32(&[0, 4]));
        multi.extend_from_slice(&v.to_le_bytes());
    }
    s.msg(REGION_WRITE_MULTI, &multi)
        .region_read(0, regs::SCRATCH_INV, 4)
        .region_read(0, regs::WRITE_COUNT, 4)
        .region_write(2, 0, &[0xab; 64])
        .region_read(0, regs::BAR2_SUM, 4)
        .region_write(7, 4, &[0x06, 0x04])
        .msg(DEVICE_RESET, &[])
        .region_read(0, regs::SCRATCH, 4);
    seed(T, "doorbells_multi_reset", &s.input(0, 0, 0));

    // Things a broken or hostile client sends.
    let mut s = Stream::default();
    s.version(QEMU_CAPS)
        .msg(14, &[])
        .msg_flags(DMA_READ, FLAG_TYPE_REPLY, &[0; 16])
        .msg_flags(REGION_WRITE, FLAG_TYPE_COMMAND | FLAG_NO_REPLY, &[0; 20])
        .region_read(0, 0xfff, 8)
        .region_read(9, 0, 4)
        .msg(DMA_READ, &[0; 16])
        .dma_map(RW, 0, 0x1001, 0x1000)
        .version(CH_CAPS);
    seed(T, "hostile", &s.input(3, 0x05, 2));

    const C: &str = "vfio_user_caps";
    for (name, caps) in [("qemu", QEMU_CAPS), ("cloud_hypervisor", CH_CAPS)] {
        let mut v = caps.as_bytes().to_vec();
        v.push(0);
        seed(C, name, &v);
    }
    seed(C, "empty", b"");
    seed(C, "no_caps", b"{}\0");
    seed(
        C,
        "padded",
        b"{\"capabilities\":{\"max_msg_fds\":4}}\0\0\0\0",
    );
}

// ---- vgpu_rings -------------------------------------------------------

/// Offsets in the target's guest RAM (address selector top nibble 0).
const CMD: u32 = 0x8_0000;
const DATA: u32 = 0x8_1000;
const COMPLETION: u32 = 0x9_0000;
const RAM_IOVA: u64 = 0x10_0000;

#[derive(Default)]
struct Ops(Vec<u8>);

impl Ops {
    fn enable(&mut self) -> &mut Self {
        self.0.extend_from_slice(&[5, 0]);
        self
    }

    fn register_reset(&mut self) -> &mut Self {
        self.0.extend_from_slice(&[5, 1]);
        self
    }

    fn setup(&mut self, q: u8, size_log: u8, slot: u8, control: u8) -> &mut Self {
        self.0.extend_from_slice(&[4, q, size_log, slot, control]);
        self
    }

    fn ram(&mut self, offset: u32, bytes: &[u8]) -> &mut Self {
        for (i, chunk) in bytes.chunks(255).enumerate() {
            self.0.push(0);
            self.0
                .extend_from_slice(&(offset + 255 * i as u32).to_le_bytes());
            self.0.push(chunk.len() as u8);
            self.0.extend_from_slice(chunk);
        }
        self
    }

    /// (offset in RAM, length, writable) per descriptor.
    fn submit(&mut self, q: u8, descs: &[(u32, u16, bool)], kick: u8) -> &mut Self {
        self.0.extend_from_slice(&[6, q, descs.len() as u8 - 1]);
        for &(addr, len, writable) in descs {
            self.0.extend_from_slice(&addr.to_le_bytes());
            self.0.extend_from_slice(&len.to_le_bytes());
            self.0.push(if writable { 2 } else { 0 });
        }
        self.0.push(kick);
        self
    }

    fn wait(&mut self, units: u8) -> &mut Self {
        self.0.extend_from_slice(&[9, units]);
        self
    }

    fn read_reg(&mut self, offset: u16) -> &mut Self {
        self.0.push(10);
        self.0.extend_from_slice(&offset.to_le_bytes());
        self.0.push(0);
        self
    }

    fn op(&mut self, op: u8) -> &mut Self {
        self.0.push(op);
        self
    }

    fn input(&self, flags: u8) -> Vec<u8> {
        let mut v = vec![flags];
        v.extend_from_slice(&self.0);
        v
    }
}

fn cmd<T: ByteValued>(c: &T) -> Vec<u8> {
    c.as_slice().to_vec()
}

fn hdr(opcode: u32, flags: u32) -> abi::CmdHeader {
    abi::CmdHeader { opcode, flags }
}

const COMP_LEN: u16 = std::mem::size_of::<abi::Completion>() as u16;

fn vgpu_rings_seeds() {
    const T: &str = "vgpu_rings";
    let nop = cmd(&hdr(abi::OP_NOP, 0));
    // NOP on an interrupt-mode queue.
    let mut o = Ops::default();
    o.setup(0, 5, 0, 1)
        .enable()
        .ram(CMD, &nop)
        .submit(0, &[(CMD, 8, false), (COMPLETION, COMP_LEN, true)], 3)
        .wait(50)
        .read_reg(abi::REG_COMMANDS as u16);
    seed(T, "nop_interrupt", &o.input(0));

    // NOPs and a TIMESTAMP on a polled queue, kicked by the doorbell alone.
    let mut o = Ops::default();
    o.enable()
        .setup(1, 4, 1, 3)
        .ram(CMD, &nop)
        .ram(CMD + 0x100, &cmd(&hdr(abi::OP_TIMESTAMP, 0)));
    for i in 0..4u32 {
        let c = if i % 2 == 0 { CMD } else { CMD + 0x100 };
        o.submit(
            1,
            &[(c, 8, false), (COMPLETION + 32 * i, COMP_LEN, true)],
            1,
        );
    }
    o.wait(100);
    seed(T, "polled", &o.input(1));

    // Allocate, fill, copy to guest RAM through a scatter-gather list,
    // fence, free.
    let dev = vgpu_backend::rules::ADDRESS_BASE;
    let alloc = abi::MemAllocCmd {
        hdr: hdr(abi::OP_MEM_ALLOC, 0),
        size: 8192,
        align: 0,
    };
    let fill = abi::FillCmd {
        hdr: hdr(abi::OP_FILL, 0),
        addr: dev,
        size: 8192,
        pattern: 0xdead_beef,
        reserved: 0,
    };
    let copy = abi::CopyCmd {
        hdr: hdr(abi::OP_COPY, 0),
        src_kind: abi::COPY_DEVICE,
        dst_kind: abi::COPY_GUEST,
        src: dev,
        dst: 0,
        size: 8192,
        sg_count: 2,
        reserved: 0,
    };
    let sg: Vec<u8> = [
        abi::SgEntry {
            addr: RAM_IOVA + 0x4_0000,
            len: 4096,
        },
        abi::SgEntry {
            addr: RAM_IOVA + 0x5_0000,
            len: 4096,
        },
    ]
    .iter()
    .flat_map(|e| e.as_slice().to_vec())
    .collect();
    let fence = abi::FenceCmd {
        hdr: hdr(abi::OP_FENCE, abi::FENCE_FLAG_IRQ),
        addr: RAM_IOVA + 0x6_0000,
        value: 7,
    };
    let free = abi::MemFreeCmd {
        hdr: hdr(abi::OP_MEM_FREE, 0),
        addr: dev,
    };
    let mut o = Ops::default();
    o.enable()
        .setup(0, 5, 0, 1)
        .ram(CMD, &cmd(&alloc))
        .ram(CMD + 0x100, &cmd(&fill))
        .ram(CMD + 0x200, &cmd(&copy))
        .ram(DATA, &sg)
        .ram(CMD + 0x300, &cmd(&fence))
        .ram(CMD + 0x400, &cmd(&free))
        .submit(0, &[(CMD, 24, false), (COMPLETION, COMP_LEN, true)], 2)
        .submit(
            0,
            &[(CMD + 0x100, 32, false), (COMPLETION + 32, COMP_LEN, true)],
            0,
        )
        .submit(
            0,
            &[
                (CMD + 0x200, 48, false),
                (DATA, 32, false),
                (COMPLETION + 64, COMP_LEN, true),
            ],
            0,
        )
        .submit(
            0,
            &[(CMD + 0x300, 24, false), (COMPLETION + 96, COMP_LEN, true)],
            0,
        )
        .submit(
            0,
            &[(CMD + 0x400, 16, false), (COMPLETION + 128, COMP_LEN, true)],
            3,
        )
        .wait(200);
    seed(T, "memory_commands", &o.input(0));

    // Queue 1 waits for a word of guest RAM that queue 0 then writes;
    // queue 2 waits for one that never holds, until the function resets.
    let word = RAM_IOVA + 0x7_0000;
    let value = |opcode, flags, value| abi::ValueCmd {
        hdr: hdr(opcode, abi::VALUE_FLAG_32 | flags),
        addr: word,
        value,
    };
    let mut o = Ops::default();
    o.enable()
        .setup(0, 5, 0, 1)
        .setup(1, 5, 1, 1)
        .setup(2, 5, 2, 1)
        .ram(CMD, &cmd(&value(abi::OP_WAIT_VALUE, abi::WAIT_GEQ, 1)))
        .ram(CMD + 0x100, &nop)
        .ram(CMD + 0x200, &cmd(&value(abi::OP_WRITE_VALUE, 0, 1)))
        .ram(CMD + 0x300, &cmd(&value(abi::OP_WAIT_VALUE, abi::WAIT_EQ, 5)))
        .submit(1, &[(CMD, 24, false), (COMPLETION, COMP_LEN, true)], 1)
        .submit(
            1,
            &[(CMD + 0x100, 8, false), (COMPLETION + 32, COMP_LEN, true)],
            1,
        )
        .submit(
            2,
            &[(CMD + 0x300, 24, false), (COMPLETION + 64, COMP_LEN, true)],
            1,
        )
        .wait(20)
        .submit(
            0,
            &[(CMD + 0x200, 24, false), (COMPLETION + 96, COMP_LEN, true)],
            1,
        )
        .wait(100)
        .register_reset();
    seed(T, "values", &o.input(0));

    // A built-in kernel launch with its parameter block.
    let mut entry = [0u8; 32];
    entry[..8].copy_from_slice(b"fill_u32");
    let launch = abi::LaunchCmd {
        hdr: hdr(abi::OP_LAUNCH, 0),
        module: abi::MODULE_BUILTIN,
        grid: [4, 1, 1],
        block: [64, 1, 1],
        shared_mem: 0,
        params_size: 24,
        entry,
    };
    let params = abi::FillParams {
        dst: dev,
        count: 256,
        value: 3,
        reserved: 0,
    };
    let mut o = Ops::default();
    o.enable()
        .setup(2, 3, 2, 1)
        .ram(CMD, &cmd(&alloc))
        .ram(CMD + 0x100, &cmd(&launch))
        .ram(DATA, &cmd(&params))
        .submit(2, &[(CMD, 24, false), (COMPLETION, COMP_LEN, true)], 3)
        .submit(
            2,
            &[
                (
                    CMD + 0x100,
                    std::mem::size_of::<abi::LaunchCmd>() as u16,
                    false,
                ),
                (DATA, 24, false),
                (COMPLETION + 32, COMP_LEN, true),
            ],
            3,
        )
        .wait(200);
    seed(T, "launch", &o.input(1));

    // Resets and unmapped guest RAM under a running queue.
    let mut o = Ops::default();
    o.enable()
        .setup(0, 6, 3, 1)
        .ram(CMD, &nop)
        .submit(0, &[(CMD, 8, false), (COMPLETION, COMP_LEN, true)], 3)
        .register_reset()
        .enable()
        .setup(0, 6, 3, 3)
        .submit(0, &[(CMD, 8, false), (COMPLETION, COMP_LEN, true)], 3)
        .op(14)
        .submit(0, &[(CMD, 8, false), (COMPLETION, COMP_LEN, true)], 3)
        .wait(20)
        .op(14)
        .op(13)
        .read_reg(abi::REG_STATUS as u16)
        .read_reg(abi::ERROR_LOG_OFFSET as u16);
    seed(T, "reset_unmap", &o.input(0));

    // A ring the device refuses: size not a power of two, then an address
    // outside guest memory.
    let mut o = Ops::default();
    o.enable();
    let q0 = |r: u64| abi::queue_reg(0, r) as u16;
    for (off, v) in [
        (q0(abi::QREG_SIZE), 3u32),
        (q0(abi::QREG_CONTROL), 1),
        (q0(abi::QREG_CONTROL), 0),
        (q0(abi::QREG_SIZE), 16),
        (q0(abi::QREG_DESC), 0xffff_f000),
        (q0(abi::QREG_CONTROL), 1),
    ] {
        o.op(1);
        o.0.extend_from_slice(&off.to_le_bytes());
        o.0.extend_from_slice(&v.to_le_bytes());
    }
    o.read_reg(q0(abi::QREG_STATUS))
        .read_reg(q0(abi::QREG_ERROR));
    seed(T, "bad_ring", &o.input(0));
}

// ---- vgpud configuration and API -------------------------------------

const CONFIG_FULL: &str = r#"[daemon]
runtime_dir = "/run/vgpud"
api_socket = "api.sock"
metrics_address = "127.0.0.1:9464"

[[gpu]]
name = "gpu0"
backend = "software"
memory = "2GiB"
compute_units = 8
policy = "fair"

[[gpu]]
name = "gpu1"
backend = "cuda"
device = 0
policy = "round-robin"
slice_us = 2000

[[vgpu]]
name = "vm1"
gpu = "gpu0"
socket = "vm1.sock"
memory = "512MiB"
compute_units = 2
priority = 1
weight = 3
cap = 0.5
queues = 8
window = "16MiB"
poll_us = 50
pci_vendor = 0x1ee7
pci_device = 0x0100

[[vgpu]]
name = "vm2"
gpu = "gpu1"
socket = "/run/vgpud/vm2.sock"
memory = 1073741824
compute_units = 1
"#;

const CONFIG_PRIORITY: &str = r#"[[gpu]]
name = "g"
backend = "software"
memory = "64K"
policy = "priority"

[[vgpu]]
name = "a-1_b"
gpu = "g"
socket = "a.sock"
memory = "4KiB"
compute_units = 1
"#;

fn config_seeds() {
    const T: &str = "vgpu_config";
    seed(T, "full.toml", CONFIG_FULL.as_bytes());
    seed(T, "priority.toml", CONFIG_PRIORITY.as_bytes());
    seed(T, "empty.toml", b"");
    seed(T, "metrics_off.toml", b"[daemon]\nmetrics_address = \"\"\n");
    seed(
        T,
        "bad_size.toml",
        b"[[gpu]]\nname = \"g\"\nbackend = \"software\"\nmemory = \"12XB\"\n",
    );
}

fn api_seeds() {
    const T: &str = "vgpud_api_request";
    let put = r#"{"name":"vm3","gpu":"gpu0","socket":"vm3.sock","memory":"64MiB","compute_units":1,"weight":2,"cap":0.25}"#;
    let patch = r#"{"weight":4,"priority":-2,"cap":null}"#;
    let requests: Vec<(&str, u8, String)> = vec![
        ("get_vgpus", 0, "GET /api/v1/vgpus HTTP/1.1\r\nHost: localhost\r\n\r\n".into()),
        ("get_vgpu", 7, "GET /api/v1/vgpus/fz HTTP/1.1\r\nHost: x\r\nAccept: */*\r\n\r\n".into()),
        ("stats_http10", 0, "GET /api/v1/stats?x=1 HTTP/1.0\r\n\r\n".into()),
        ("gpus", 3, "GET /api/v1/gpus HTTP/1.1\r\nHost: h\r\nUser-Agent: vgpuctl\r\n\r\n".into()),
        (
            "put",
            0,
            format!(
                "PUT /api/v1/vgpus HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{put}",
                put.len()
            ),
        ),
        (
            "patch_continue",
            16,
            format!(
                "PATCH /api/v1/vgpus/fz HTTP/1.1\r\nHost: localhost\r\nExpect: 100-continue\r\nContent-Length: {}\r\n\r\n{patch}",
                patch.len()
            ),
        ),
        ("delete", 0, "DELETE /api/v1/vgpus/vm9 HTTP/1.1\r\nHost: localhost\r\nContent-Length: 0\r\n\r\n".into()),
        ("metrics", 1, "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1:9464\r\n\r\n".into()),
    ];
    for (name, chunk, text) in requests {
        let mut v = vec![chunk];
        v.extend_from_slice(text.as_bytes());
        seed(T, name, &v);
    }
}

/// The PTX and fatbinary targets start from kernels of the executor's
/// corpus, as nvcc made them.
fn ptx_seeds() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../crates/vgpu-ptx/tests/corpus");
    let files = [
        ("ptx_parse", "vector_add.ptx"),
        ("ptx_parse", "reduce_shfl.ptx"),
        ("ptx_parse", "divergent.ptx"),
        ("ptx_parse", "histogram.ptx"),
        ("fatbin", "vector_add.lz4.fatbin"),
        ("fatbin", "vector_add.zstd.fatbin"),
    ];
    for (target, name) in files {
        let data = fs::read(dir.join(name)).expect("corpus file");
        seed(target, name, &data);
    }
}

fn main() {
    vfio_user_seeds();
    vgpu_rings_seeds();
    config_seeds();
    api_seeds();
    ptx_seeds();
    println!(
        "seeds written under {}",
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("corpus")
            .display()
    );
}
