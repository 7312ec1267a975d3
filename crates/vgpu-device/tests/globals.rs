//! FUNC_INFO of a module global: the device writes where the global is
//! and how large, returns its address with the size as the second
//! result, and COPY then reaches it. The software backend places a
//! module's variables in its device memory too.

mod common;

use common::{assert_status, vgpu_ready, MIB};
use vgpu_backend::conformance;
use vgpu_backend::software::SoftwareBackend;
use vgpu_backend::{
    FunctionInfo, HostSink, HostSource, Launch, OpError, Partition, PartitionSpec, Queued,
    QueuedDone,
};
use vgpu_device::testing::{test_config, TestVgpu};
use vgpu_testkit::abi::{self, ByteValued, CmdHeader};
use vgpu_testkit::{Chain, Guest, Mode};

/// A software partition whose modules have one global, `table`, placed
/// in device memory as a GPU's driver places it.
struct WithGlobals {
    inner: Box<dyn Partition>,
    table: Option<u64>,
}

const TABLE_BYTES: u64 = 256;

impl Partition for WithGlobals {
    fn spec(&self) -> &PartitionSpec {
        self.inner.spec()
    }
    fn kernel_compute_units(&self) -> u32 {
        self.inner.kernel_compute_units()
    }
    fn alloc(&mut self, size: u64, align: u64) -> Result<u64, OpError> {
        self.inner.alloc(size, align)
    }
    fn free(&mut self, addr: u64) -> Result<(), OpError> {
        self.inner.free(addr)
    }
    fn upload(&mut self, dst: u64, src: &dyn HostSource) -> Result<(), OpError> {
        self.inner.upload(dst, src)
    }
    fn download(&mut self, src: u64, dst: &dyn HostSink) -> Result<(), OpError> {
        self.inner.download(src, dst)
    }
    fn copy(&mut self, dst: u64, src: u64, size: u64) -> Result<(), OpError> {
        self.inner.copy(dst, src, size)
    }
    fn fill(&mut self, addr: u64, size: u64, pattern: u32) -> Result<(), OpError> {
        self.inner.fill(addr, size, pattern)
    }
    fn module_load(&mut self, format: u32, image: &[u8]) -> Result<u64, OpError> {
        self.inner.module_load(format, image)
    }
    fn module_unload(&mut self, module: u64) -> Result<(), OpError> {
        self.inner.module_unload(module)
    }
    fn launch(&mut self, launch: &Launch<'_>) -> Result<(), OpError> {
        self.inner.launch(launch)
    }
    fn run_queued(&mut self, steps: &[Queued<'_>], stop: &dyn Fn() -> bool) -> Vec<QueuedDone> {
        self.inner.run_queued(steps, stop)
    }
    fn max_active_clusters(&mut self, launch: &Launch<'_>) -> Result<u32, OpError> {
        self.inner.max_active_clusters(launch)
    }
    fn function_info(&mut self, module: u64, entry: &str) -> Result<FunctionInfo, OpError> {
        self.inner.function_info(module, entry)
    }
    fn global_info(&mut self, module: u64, name: &str) -> Result<(u64, u64), OpError> {
        // The module must exist; its functions say so.
        self.inner.function_info(module, "vector_add")?;
        if name != "table" {
            return Err(OpError::NotFound(format!("global {name:?}")));
        }
        let addr = match self.table {
            Some(a) => a,
            None => *self.table.insert(self.inner.alloc(TABLE_BYTES, 0)?),
        };
        Ok((addr, TABLE_BYTES))
    }
    fn memory_used(&self) -> u64 {
        self.inner.memory_used()
    }
    fn set_memory(&mut self, memory: u64) -> Result<(), OpError> {
        self.inner.set_memory(memory)
    }
    fn suspend(&mut self) -> Result<u64, OpError> {
        self.inner.suspend()
    }
    fn resume(&mut self) -> Result<u64, OpError> {
        self.inner.resume()
    }
    fn console(
        &mut self,
        module: u64,
        max: usize,
    ) -> Result<vgpu_backend::console::ConsoleText, OpError> {
        self.inner.console(module, max)
    }
    fn reset(&mut self) {
        self.table = None;
        self.inner.reset()
    }
    fn is_lost(&self) -> bool {
        self.inner.is_lost()
    }
}

fn global_info(g: &mut Guest, module: u64, name: &str, out: u64, out_size: u32) -> abi::Completion {
    let cmd = abi::FuncInfoCmd {
        hdr: CmdHeader {
            opcode: abi::OP_FUNC_INFO,
            flags: abi::FUNC_INFO_FLAG_GLOBAL,
        },
        module,
        out,
        out_size,
        name_len: name.len() as u32,
    };
    g.run(0, &Chain::command(&cmd).bytes(name.as_bytes()).completion())
}

fn load(g: &mut Guest) -> u64 {
    let ptx = conformance::portable(conformance::corpus::VECTOR_ADD);
    let c = g.module_load(0, abi::MODULE_FORMAT_PTX, &ptx);
    assert_status(c, abi::STATUS_OK);
    c.result
}

#[test]
fn test_a_global_is_described_and_reachable_by_copy() {
    let backend = SoftwareBackend::new(16 * MIB, 2);
    let inner = vgpu_device::testing::software_partition(&backend, "globals", 16 * MIB, 2);
    let p = WithGlobals { inner, table: None };
    let server = TestVgpu::start(test_config("globals", 2), Box::new(p));
    let mut g = server.connect();
    g.setup_queue(0, 64, Mode::Interrupt);
    let module = load(&mut g);
    let out = g.device_alloc(0, 64);

    let c = global_info(&mut g, module, "table", out, 16);
    assert_status(c, abi::STATUS_OK);
    assert_eq!(c.result2, TABLE_BYTES);
    let raw = g.download(0, out, 16);
    let info = abi::GlobalInfo::from_slice(&raw).copied().unwrap();
    assert_eq!((info.addr, info.size), (c.result, TABLE_BYTES));
    // What cudaMemcpyToSymbol and cudaMemcpyFromSymbol do.
    let data: Vec<u8> = (0..TABLE_BYTES).map(|i| i as u8).collect();
    g.upload(0, info.addr, &data);
    assert_eq!(g.download(0, info.addr, data.len()), data);

    // Unknown names, a bad flag, too little room, no module.
    assert_status(
        global_info(&mut g, module, "nothing", out, 16),
        abi::STATUS_NOT_FOUND,
    );
    assert_status(
        global_info(&mut g, module, "table", out, 15),
        abi::STATUS_INVALID,
    );
    assert_status(
        global_info(&mut g, module + 99, "table", out, 16),
        abi::STATUS_NOT_FOUND,
    );
    let mut bad = abi::FuncInfoCmd {
        hdr: CmdHeader {
            opcode: abi::OP_FUNC_INFO,
            flags: 2,
        },
        module,
        out,
        out_size: 16,
        name_len: 5,
    };
    let c = g.run(0, &Chain::command(&bad).bytes(b"table").completion());
    assert_status(c, abi::STATUS_INVALID);
    bad.hdr.flags = abi::FUNC_INFO_FLAG_GLOBAL | abi::LAUNCH_FLAG_FUNCTION << 1;
    let c = g.run(0, &Chain::command(&bad).bytes(b"table").completion());
    assert_status(c, abi::STATUS_INVALID);
}

#[test]
fn test_the_software_backend_places_globals() {
    let (_s, mut g) = vgpu_ready();
    let module = load(&mut g);
    let out = g.device_alloc(0, 4096);
    assert_status(
        global_info(&mut g, module, "table", out, 16),
        abi::STATUS_NOT_FOUND,
    );
    let c = g.module_load(
        0,
        abi::MODULE_FORMAT_PTX,
        conformance::GLOBAL_PTX.as_bytes(),
    );
    assert_status(c, abi::STATUS_OK);
    let c = global_info(&mut g, c.result, "table", out, 16);
    assert_status(c, abi::STATUS_OK);
    assert_eq!(c.result2, 64);
    // A kernel's FUNC_INFO leaves the second result zero.
    let c = g.func_info(0, module, "vector_add", out, 4096);
    assert_status(c, abi::STATUS_OK);
    assert_eq!(c.result2, 0);
}
