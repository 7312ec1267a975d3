//! The partition-host protocol's decoders on arbitrary bytes: a header, a
//! request as a host receives it, a reply as the daemon receives it from a
//! host (which runs guest kernels and is trusted less), a staging piece
//! and a fault answer. Each returns a value or an error, never panics, and
//! whatever decodes encodes back to something that decodes to the same.
//!
//! Input: kind (2 bytes, little endian), then the payload; the first
//! `HEADER_LEN` bytes are also tried as a header.

#![no_main]

use libfuzzer_sys::fuzz_target;
use vgpu_backend_remote::proto::{decode_answer, Header, Kind, Piece, Reply, Request, HEADER_LEN};

fuzz_target!(|data: &[u8]| {
    if let Some(h) = data.get(..HEADER_LEN) {
        let h: &[u8; HEADER_LEN] = h.try_into().expect("HEADER_LEN bytes");
        if let Ok(header) = Header::decode(h, 1 << 20) {
            assert!(header.len <= 1 << 20);
            assert_eq!(Header::decode(&header.encode(), 1 << 20), Ok(header));
        }
    }
    let Some((kind, payload)) = data.split_first_chunk::<2>() else {
        return;
    };
    let kind = u16::from_le_bytes(*kind);
    if let Ok(req) = Request::decode(kind, payload) {
        let again = req.encode();
        assert_eq!(Request::decode(req.kind() as u16, &again).as_ref(), Ok(&req));
    }
    if let Some(k) = Kind::from_raw(kind) {
        if let Ok(rep) = Reply::decode(k, payload) {
            let again = rep.encode(k);
            assert_eq!(Reply::decode(k, &again), Ok(rep));
        }
    }
    if let Ok(p) = Piece::decode(payload) {
        assert_eq!(Piece::decode(&p.encode()), Ok(p));
    }
    let _ = decode_answer(payload);
});
