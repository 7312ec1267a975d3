//! `PeerCaps::parse`, the decoder of the JSON capabilities a client sends
//! with VERSION, on arbitrary bytes: it accepts or refuses, never panics,
//! and what it accepts is within the limits the server relies on.

#![no_main]

use libfuzzer_sys::fuzz_target;
use vfio_user_server::proto::{reply_caps_json, PeerCaps};

fuzz_target!(|data: &[u8]| {
    let Ok(caps) = PeerCaps::parse(data) else {
        return;
    };
    assert!((1..=1024).contains(&caps.max_msg_fds), "{caps:?}");
    assert!(caps.max_data_xfer_size > 0, "{caps:?}");
    assert!(caps.max_dma_maps > 0, "{caps:?}");
    // The reply built from them is JSON and offers no more than asked.
    let reply = reply_caps_json(&caps);
    let v: serde_json::Value = serde_json::from_str(&reply).expect("reply is JSON");
    let c = &v["capabilities"];
    let xfer = c["max_data_xfer_size"]
        .as_u64()
        .expect("max_data_xfer_size");
    assert!(xfer <= u64::from(caps.max_data_xfer_size), "{reply}");
    let maps = c["max_dma_maps"].as_u64().expect("max_dma_maps");
    assert!(maps <= u64::from(caps.max_dma_maps), "{reply}");
    assert_eq!(
        c.get("write_multiple").is_some(),
        caps.write_multiple,
        "{reply}"
    );
    // Parsing what was accepted, as the server does, gives it back.
    let mut again = reply.into_bytes();
    again.push(0);
    PeerCaps::parse(&again).expect("the server's own reply parses");
});
