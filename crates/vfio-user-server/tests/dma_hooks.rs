//! The device model hears of DMA mappings: `dma_mapped` for memory shared
//! by fd (with where it lies in this process and in its file), nothing for
//! fd-less memory, and `dma_unmapped` while the removed memory is still
//! mapped here but no longer reachable through the table.

mod common;

use std::io::Write;
use std::sync::{Arc, Mutex};

use common::{guest_ram, raw, RawClient, TestServer};
use vfio_user_server::device::{IrqInfo, RegionInfo};
use vfio_user_server::dma::{Mapped, Unmapped};
use vfio_user_server::sample::SampleDevice;
use vfio_user_server::{DeviceContext, DeviceError, DmaSpace, PciDevice};

const CMD_DMA_MAP: u16 = 2;
const CMD_DMA_UNMAP: u16 = 3;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Event {
    Mapped {
        id: u64,
        iova: u64,
        size: u64,
        file_offset: u64,
        first_bytes: Vec<u8>,
    },
    /// A removed mapping, with what the model saw while told of it.
    Unmapped {
        id: u64,
        iova: u64,
        still_mapped_here: bool,
        reachable_through_table: bool,
    },
}

/// The sample device, recording mapping notices.
struct Recorder {
    inner: SampleDevice,
    dma: Option<Arc<DmaSpace>>,
    hosts: Vec<(u64, usize)>,
    events: Arc<Mutex<Vec<Event>>>,
}

/// Whether `addr` lies in a mapping of this process.
fn is_mapped(addr: usize) -> bool {
    std::fs::read_to_string("/proc/self/maps")
        .unwrap()
        .lines()
        .filter_map(|l| l.split_whitespace().next()?.split_once('-'))
        .any(|(a, b)| {
            let a = usize::from_str_radix(a, 16).unwrap();
            let b = usize::from_str_radix(b, 16).unwrap();
            (a..b).contains(&addr)
        })
}

impl PciDevice for Recorder {
    fn bind(&mut self, ctx: DeviceContext) {
        self.dma = Some(ctx.dma.clone());
        self.inner.bind(ctx);
    }
    fn region_info(&self, index: u32) -> RegionInfo {
        self.inner.region_info(index)
    }
    fn irq_info(&self, index: u32) -> IrqInfo {
        self.inner.irq_info(index)
    }
    fn region_read(&mut self, index: u32, offset: u64, data: &mut [u8]) -> Result<(), DeviceError> {
        self.inner.region_read(index, offset, data)
    }
    fn region_write(&mut self, index: u32, offset: u64, data: &[u8]) -> Result<(), DeviceError> {
        self.inner.region_write(index, offset, data)
    }
    fn reset(&mut self) {
        self.inner.reset()
    }
    fn dma_mapped(&mut self, m: &Mapped) {
        // SAFETY: the engine keeps the mapping's `size` bytes mapped at
        // `host_addr` at least until it reports the mapping removed.
        let first = unsafe { std::slice::from_raw_parts(m.host_addr as *const u8, 4) };
        self.hosts.push((m.id, m.host_addr));
        self.events.lock().unwrap().push(Event::Mapped {
            id: m.id,
            iova: m.iova,
            size: m.size,
            file_offset: m.file_offset,
            first_bytes: first.to_vec(),
        });
    }
    fn dma_unmapped(&mut self, ranges: &[Unmapped]) {
        let dma = self.dma.as_ref().expect("bound");
        for r in ranges {
            let host = self.hosts.iter().find(|(id, _)| *id == r.id).map(|h| h.1);
            let mut b = [0u8; 1];
            self.events.lock().unwrap().push(Event::Unmapped {
                id: r.id,
                iova: r.iova,
                still_mapped_here: host.is_some_and(is_mapped),
                reachable_through_table: dma.read(r.iova, &mut b).is_ok(),
            });
        }
    }
}

fn map_payload(iova: u64, size: u64, offset: u64) -> Vec<u8> {
    let mut p = Vec::new();
    for v in [32u32, 3] {
        p.extend_from_slice(&v.to_le_bytes());
    }
    for v in [offset, iova, size] {
        p.extend_from_slice(&v.to_le_bytes());
    }
    p
}

fn unmap_payload(iova: u64, size: u64) -> Vec<u8> {
    let mut p = Vec::new();
    for v in [24u32, 0] {
        p.extend_from_slice(&v.to_le_bytes());
    }
    for v in [iova, size] {
        p.extend_from_slice(&v.to_le_bytes());
    }
    p
}

fn start() -> (TestServer, Arc<Mutex<Vec<Event>>>) {
    let events = Arc::new(Mutex::new(Vec::new()));
    let dev = Recorder {
        inner: SampleDevice::new().unwrap(),
        dma: None,
        hosts: Vec::new(),
        events: events.clone(),
    };
    (TestServer::start(Box::new(dev)), events)
}

#[test]
fn test_fd_maps_are_announced_and_released_before_munmap() {
    let (server, events) = start();
    let mut c = RawClient::connect_negotiated(&server.path);
    let mut ram = guest_ram(0x3000);
    ram.write_all(&[0u8; 0x1000]).unwrap();
    ram.write_all(b"ram!").unwrap();
    // Memory shared by fd (at file offset 0x1000), and memory without.
    assert!(!c
        .call(
            CMD_DMA_MAP,
            &map_payload(0x10_0000, 0x2000, 0x1000),
            &[raw(&ram)]
        )
        .is_error());
    assert!(!c
        .call(CMD_DMA_MAP, &map_payload(0x20_0000, 0x1000, 0), &[])
        .is_error());
    let id = {
        let ev = events.lock().unwrap();
        assert_eq!(
            ev.len(),
            1,
            "only the fd-backed mapping is announced: {ev:?}"
        );
        let Event::Mapped {
            id,
            iova,
            size,
            file_offset,
            first_bytes,
        } = &ev[0]
        else {
            panic!("{ev:?}");
        };
        assert_eq!((*iova, *size, *file_offset), (0x10_0000, 0x2000, 0x1000));
        assert_eq!(first_bytes, b"ram!");
        *id
    };
    // Unmapping both: one notice per removed mapping; the fd-backed one
    // is out of the table but still mapped in this process meanwhile.
    assert!(!c
        .call(CMD_DMA_UNMAP, &unmap_payload(0, 1 << 40), &[])
        .is_error());
    let ev = events.lock().unwrap().clone();
    assert_eq!(ev.len(), 3, "{ev:?}");
    assert_eq!(
        ev[1],
        Event::Unmapped {
            id,
            iova: 0x10_0000,
            still_mapped_here: true,
            reachable_through_table: false,
        }
    );
    let Event::Unmapped {
        id: other,
        iova: 0x20_0000,
        reachable_through_table: false,
        ..
    } = ev[2]
    else {
        panic!("{ev:?}");
    };
    assert_ne!(other, id);
}

#[test]
fn test_disconnect_releases_mappings_through_the_hook() {
    let (server, events) = start();
    let mut c = RawClient::connect_negotiated(&server.path);
    let ram = guest_ram(0x1000);
    assert!(!c
        .call(
            CMD_DMA_MAP,
            &map_payload(0x10_0000, 0x1000, 0),
            &[raw(&ram)]
        )
        .is_error());
    drop(c);
    // The next client is served only after the first one's teardown.
    drop(RawClient::connect_negotiated(&server.path));
    let ev = events.lock().unwrap().clone();
    assert_eq!(ev.len(), 2, "{ev:?}");
    assert!(matches!(
        ev[1],
        Event::Unmapped {
            iova: 0x10_0000,
            still_mapped_here: true,
            reachable_through_table: false,
            ..
        }
    ));
}

#[test]
fn test_stopping_the_endpoint_releases_mappings_through_the_hook() {
    let (server, events) = start();
    let mut c = RawClient::connect_negotiated(&server.path);
    let ram = guest_ram(0x1000);
    assert!(!c
        .call(
            CMD_DMA_MAP,
            &map_payload(0x10_0000, 0x1000, 0),
            &[raw(&ram)]
        )
        .is_error());
    drop(server);
    let ev = events.lock().unwrap().clone();
    assert_eq!(ev.len(), 2, "{ev:?}");
    assert!(matches!(
        ev[1],
        Event::Unmapped {
            iova: 0x10_0000,
            still_mapped_here: true,
            reachable_through_table: false,
            ..
        }
    ));
}
