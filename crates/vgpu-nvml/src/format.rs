//! The identities NVML reports, as text: UUIDs and PCI bus ids.

use std::fmt::Write as _;

/// A PCI function's location.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PciAddr {
    pub domain: u32,
    pub bus: u8,
    pub device: u8,
    pub function: u8,
}

impl PciAddr {
    /// From the domain, bus and `devfn` the driver reports.
    pub fn new(domain: u32, bus: u8, devfn: u8) -> PciAddr {
        PciAddr {
            domain,
            bus,
            device: devfn >> 3,
            function: devfn & 7,
        }
    }

    /// `nvmlPciInfo_t::busId`: `%08X:%02X:%02X.%X`.
    pub fn bus_id(&self) -> String {
        format!(
            "{:08X}:{:02X}:{:02X}.{:X}",
            self.domain, self.bus, self.device, self.function
        )
    }

    /// `nvmlPciInfo_t::busIdLegacy`: `%04X:%02X:%02X.%X`.
    pub fn bus_id_legacy(&self) -> String {
        format!(
            "{:04X}:{:02X}:{:02X}.{:X}",
            self.domain & 0xffff,
            self.bus,
            self.device,
            self.function
        )
    }

    /// The sysfs name of the function: `0000:00:03.0`.
    pub fn sysfs_name(&self) -> String {
        format!(
            "{:04x}:{:02x}:{:02x}.{:x}",
            self.domain, self.bus, self.device, self.function
        )
    }

    /// Parses a bus id in the forms `nvmlDeviceGetHandleByPciBusId`
    /// accepts, all numbers hexadecimal: `domain:bus:device.function`,
    /// `domain:bus:device` (function 0) and `bus:device.function`
    /// (domain 0).
    pub fn parse(s: &str) -> Option<PciAddr> {
        let s = s.trim_matches(|c: char| c.is_whitespace() || c == '\0');
        let hex = |t: &str, max: u32| {
            if t.is_empty() || t.len() > 8 {
                return None;
            }
            u32::from_str_radix(t, 16).ok().filter(|&v| v <= max)
        };
        let parts: Vec<&str> = s.split(':').collect();
        let (domain, bus, rest) = match parts.as_slice() {
            [d, b, rest] => (hex(d, u32::MAX)?, *b, *rest),
            [b, rest] if rest.contains('.') => (0, *b, *rest),
            _ => return None,
        };
        let (device, function) = match rest.split_once('.') {
            Some((d, f)) => (d, hex(f, 7)?),
            None => (rest, 0),
        };
        Some(PciAddr {
            domain,
            bus: hex(bus, 0xff)? as u8,
            device: hex(device, 0x1f)? as u8,
            function: function as u8,
        })
    }
}

/// `nvmlDeviceGetUUID`'s text: `GPU-` and the 16 bytes as 8-4-4-4-12
/// lower-case hex digits.
pub fn uuid(bytes: &[u8; 16]) -> String {
    let mut s = String::from("GPU-");
    for (i, b) in bytes.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            s.push('-');
        }
        let _ = write!(s, "{b:02x}");
    }
    s
}

/// The share of `wall_ns` the device was busy for `busy_ns` of, in whole
/// percent (at most 100: queues running side by side can add up to
/// more device time than wall time).
pub fn percent(busy_ns: u64, wall_ns: u64) -> u32 {
    if wall_ns == 0 {
        return 0;
    }
    let p = (u128::from(busy_ns) * 100 + u128::from(wall_ns) / 2) / u128::from(wall_ns);
    p.min(100) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuids_are_gpu_and_8_4_4_4_12_hex() {
        let mut b = [0u8; 16];
        b[..4].copy_from_slice(b"VGPU");
        b[15] = 0xab;
        let s = uuid(&b);
        assert_eq!(s, "GPU-56475055-0000-0000-0000-0000000000ab");
        assert_eq!(s.len() + 1, crate::nvml::DEVICE_UUID_ASCII_LEN);
    }

    #[test]
    fn bus_ids_are_nvml_s_formats() {
        let a = PciAddr::new(0, 0x01, 0x18);
        assert_eq!(a.device, 3);
        assert_eq!(a.bus_id(), "00000000:01:03.0");
        assert_eq!(a.bus_id_legacy(), "0000:01:03.0");
        assert_eq!(a.sysfs_name(), "0000:01:03.0");
    }

    #[test]
    fn bus_ids_parse_in_every_accepted_form() {
        let want = PciAddr {
            domain: 0,
            bus: 0x0a,
            device: 0x1f,
            function: 0,
        };
        for s in [
            "00000000:0A:1F.0",
            "0000:0a:1f.0",
            "0:a:1f",
            "0a:1f.0",
            " 0000:0a:1f.0\0",
        ] {
            assert_eq!(PciAddr::parse(s), Some(want), "{s}");
        }
        assert_eq!(
            PciAddr::parse("0001:00:02.7"),
            Some(PciAddr {
                domain: 1,
                bus: 0,
                device: 2,
                function: 7
            })
        );
        for bad in [
            "",
            "0000",
            "0000:00",
            "0000:100:00.0",
            "0000:00:20.0",
            "0000:00:00.8",
            "0000:00:00.0:0",
            "zz:00.0",
            "0000:00:.0",
            "123456789:00:00.0",
        ] {
            assert_eq!(PciAddr::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn utilization_is_rounded_and_capped() {
        assert_eq!(percent(0, 1_000), 0);
        assert_eq!(percent(500, 1_000), 50);
        assert_eq!(percent(5, 1_000), 1);
        assert_eq!(percent(4, 1_000), 0);
        assert_eq!(percent(3_000, 1_000), 100);
        assert_eq!(percent(u64::MAX, 1), 100);
        assert_eq!(percent(10, 0), 0);
    }
}
