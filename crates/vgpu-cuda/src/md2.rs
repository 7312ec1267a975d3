//! MD2 (RFC 1319) and HMAC over it: the CUDA runtime checks the driver
//! it loaded with an HMAC-MD2 of the process's identity (see
//! `export::integrity_check`).

/// MD2's substitution table, from the digits of pi (RFC 1319, 3.2).
const S: [u8; 256] = [
    41, 46, 67, 201, 162, 216, 124, 1, 61, 54, 84, 161, 236, 240, 6, 19, 98, 167, 5, 243, 192, 199,
    115, 140, 152, 147, 43, 217, 188, 76, 130, 202, 30, 155, 87, 60, 253, 212, 224, 22, 103, 66,
    111, 24, 138, 23, 229, 18, 190, 78, 196, 214, 218, 158, 222, 73, 160, 251, 245, 142, 187, 47,
    238, 122, 169, 104, 121, 145, 21, 178, 7, 63, 148, 194, 16, 137, 11, 34, 95, 33, 128, 127, 93,
    154, 90, 144, 50, 39, 53, 62, 204, 231, 191, 247, 151, 3, 255, 25, 48, 179, 72, 165, 181, 209,
    215, 94, 146, 42, 172, 86, 170, 198, 79, 184, 56, 210, 150, 164, 125, 182, 118, 252, 107, 226,
    156, 116, 4, 241, 69, 157, 112, 89, 100, 113, 135, 32, 134, 91, 207, 101, 230, 45, 168, 2, 27,
    96, 37, 173, 174, 176, 185, 246, 28, 70, 97, 105, 52, 64, 126, 15, 85, 71, 163, 35, 221, 81,
    175, 58, 195, 92, 249, 206, 186, 197, 234, 38, 44, 83, 13, 110, 133, 40, 132, 9, 211, 223, 205,
    244, 65, 129, 77, 82, 106, 220, 55, 200, 108, 193, 171, 250, 36, 225, 123, 8, 12, 189, 177, 74,
    120, 136, 149, 139, 227, 99, 232, 109, 233, 203, 213, 254, 59, 0, 29, 57, 242, 239, 183, 14,
    102, 88, 208, 228, 166, 119, 114, 248, 235, 117, 75, 10, 49, 68, 80, 180, 143, 237, 31, 26,
    219, 153, 141, 51, 159, 17, 131, 20,
];

/// An MD2 computation in progress.
#[derive(Clone)]
pub struct Md2 {
    x: [u8; 48],
    checksum: [u8; 16],
    block: [u8; 16],
    used: usize,
    last: u8,
}

impl Default for Md2 {
    fn default() -> Self {
        Md2 {
            x: [0; 48],
            checksum: [0; 16],
            block: [0; 16],
            used: 0,
            last: 0,
        }
    }
}

impl Md2 {
    /// Adds `data` to the message.
    pub fn update(&mut self, data: &[u8]) {
        for &b in data {
            self.block[self.used] = b;
            self.used += 1;
            if self.used == 16 {
                self.compress();
                self.used = 0;
            }
        }
    }

    fn compress(&mut self) {
        for j in 0..16 {
            self.x[16 + j] = self.block[j];
            self.x[32 + j] = self.block[j] ^ self.x[j];
            self.checksum[j] ^= S[usize::from(self.block[j] ^ self.last)];
            self.last = self.checksum[j];
        }
        let mut t = 0u8;
        for round in 0..18u8 {
            for k in 0..48 {
                self.x[k] ^= S[usize::from(t)];
                t = self.x[k];
            }
            t = t.wrapping_add(round);
        }
    }

    /// Pads the message and returns its digest.
    pub fn finish(mut self) -> [u8; 16] {
        let pad = 16 - self.used;
        self.update(&vec![pad as u8; pad]);
        let checksum = self.checksum;
        self.update(&checksum);
        self.x[..16].try_into().expect("16 bytes")
    }
}

/// HMAC (RFC 2104) over MD2 with a key of one block.
pub fn hmac_md2(key: &[u8; 16], message: &[&[u8]]) -> [u8; 16] {
    let mut inner = Md2::default();
    inner.update(&key.map(|b| b ^ 0x36));
    for part in message {
        inner.update(part);
    }
    let inner = inner.finish();
    let mut outer = Md2::default();
    outer.update(&key.map(|b| b ^ 0x5c));
    outer.update(&inner);
    outer.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn md2(s: &str) -> String {
        let mut h = Md2::default();
        h.update(s.as_bytes());
        h.finish().iter().map(|b| format!("{b:02x}")).collect()
    }

    #[test]
    fn rfc_1319_test_suite() {
        assert_eq!(md2(""), "8350e5a3e24c153df2275c9f80692773");
        assert_eq!(md2("a"), "32ec01ec4a6dac72c0ab96fb34c0b5d1");
        assert_eq!(md2("abc"), "da853b0d3f88d99b30283a69e6ded6bb");
        assert_eq!(md2("message digest"), "ab4f496bfb2a530b219ff33031fe06b0");
        assert_eq!(
            md2("abcdefghijklmnopqrstuvwxyz"),
            "4e8ddff3650292ab5a4108c3aa47940b"
        );
        assert_eq!(
            md2("12345678901234567890123456789012345678901234567890123456789012345678901234567890"),
            "d5976f79d83d3a0dc9806c3c66f3efd8"
        );
    }

    #[test]
    fn hmac_differs_with_key_and_message() {
        let a = hmac_md2(&[1; 16], &[b"x"]);
        assert_ne!(a, hmac_md2(&[2; 16], &[b"x"]));
        assert_ne!(a, hmac_md2(&[1; 16], &[b"y"]));
        assert_eq!(a, hmac_md2(&[1; 16], &[b"", b"x"]));
    }
}
