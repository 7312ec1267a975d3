//! WRITE_VALUE and WAIT_VALUE: a queue writes a word of guest memory in
//! its order, and a queue waits for a word before it goes on (without
//! holding up the function's other queues), whoever changes the word:
//! another queue of the function, or the guest's CPU.

mod common;

use std::time::Duration;

use common::{assert_status, vgpu, QUIET};
use vgpu_testkit::abi::{self};
use vgpu_testkit::{fill_chain, value_chain, Mode};

const WAIT: u32 = abi::OP_WAIT_VALUE;
const WRITE: u32 = abi::OP_WRITE_VALUE;

#[test]
fn test_write_value_writes_words_in_queue_order() {
    let (_s, mut g) = vgpu(1);
    g.enable_device();
    g.setup_queue(0, 64, Mode::Interrupt);
    let word = g.alloc(16, 8);
    g.write(word, &[0xff; 16]);
    let c = g.run(0, &value_chain(WRITE, 0, word, 0x1122_3344_5566_7788));
    assert_status(c, abi::STATUS_OK);
    assert_eq!(g.read(word, 8), 0x1122_3344_5566_7788u64.to_le_bytes());
    let c = g.run(
        0,
        &value_chain(WRITE, abi::VALUE_FLAG_32, word + 8, 0xdead_beef_0000_0007),
    );
    assert_status(c, abi::STATUS_OK);
    assert_eq!(g.read(word + 8, 8), [7, 0, 0, 0, 0xff, 0xff, 0xff, 0xff]);
    // Misaligned, unknown flags, out of reach.
    assert_status(
        g.run(0, &value_chain(WRITE, 0, word + 4, 1)),
        abi::STATUS_INVALID,
    );
    assert_status(
        g.run(0, &value_chain(WRITE, abi::VALUE_FLAG_32, word + 2, 1)),
        abi::STATUS_INVALID,
    );
    assert_status(
        g.run(0, &value_chain(WRITE, 1 << 5, word, 1)),
        abi::STATUS_INVALID,
    );
    let far = g.unmapped_addr();
    assert_status(g.run(0, &value_chain(WRITE, 0, far, 1)), abi::STATUS_FAULT);
    assert_eq!(g.read(word, 8), 0x1122_3344_5566_7788u64.to_le_bytes());
    assert_eq!(g.queue_status(0), abi::QSTATUS_ENABLED);
}

#[test]
fn test_wait_value_conditions_that_hold_complete_at_once() {
    let (_s, mut g) = vgpu(1);
    g.enable_device();
    g.setup_queue(0, 64, Mode::Interrupt);
    let word = g.alloc(8, 8);
    g.write(word, &0x0000_0001_8000_0005u64.to_le_bytes());
    let holds = [
        (abi::WAIT_GEQ, 0x0000_0001_8000_0005),
        (abi::WAIT_GEQ, 0x0000_0001_0000_0000),
        // Wrapped: 5 is ahead of u64::MAX - 2.
        (abi::WAIT_GEQ, u64::MAX - 2),
        (abi::WAIT_EQ, 0x0000_0001_8000_0005),
        (abi::WAIT_AND, 0x4),
        (abi::WAIT_NOR, 0x2),
        (abi::WAIT_GEQ | abi::VALUE_FLAG_32, 0x7fff_fff0),
        (abi::WAIT_EQ | abi::VALUE_FLAG_32, 0xffff_ffff_8000_0005),
        (abi::WAIT_AND | abi::VALUE_FLAG_32, 0x8000_0000),
    ];
    for (flags, value) in holds {
        let c = g.run(0, &value_chain(WAIT, flags, word, value));
        assert_status(c, abi::STATUS_OK);
    }
    assert_status(
        g.run(0, &value_chain(WAIT, 0, word + 4, 0)),
        abi::STATUS_INVALID,
    );
    assert_status(
        g.run(0, &value_chain(WAIT, 1 << 5, word, 0)),
        abi::STATUS_INVALID,
    );
    assert_status(
        g.run(0, &value_chain(WAIT, 0, g.unmapped_addr(), 0)),
        abi::STATUS_FAULT,
    );
}

#[test]
fn test_a_queue_waits_for_another_queues_write() {
    let (_s, mut g) = vgpu(2);
    g.enable_device();
    g.setup_queue(0, 64, Mode::Interrupt);
    g.setup_queue(1, 64, Mode::Interrupt);
    let word = g.alloc(8, 8);
    let dev = g.device_alloc(0, 4096);
    // Queue 0: wait for the word to reach 2, then fill.
    let wait = g.post(0, &value_chain(WAIT, abi::WAIT_GEQ, word, 2));
    let fill = g.post(0, &fill_chain(dev, 4096, 0x0303_0303));
    g.kick(0);
    std::thread::sleep(QUIET);
    assert!(g.poll_used(0).is_none(), "the wait held its queue");
    // Queue 1 goes on meanwhile; its first write is not enough.
    assert_status(g.run(1, &value_chain(WRITE, 0, word, 1)), abi::STATUS_OK);
    assert_status(g.nop(1), abi::STATUS_OK);
    std::thread::sleep(QUIET);
    assert!(g.poll_used(0).is_none(), "1 is not 2");
    assert_status(g.run(1, &value_chain(WRITE, 0, word, 2)), abi::STATUS_OK);
    for head in [wait, fill] {
        let u = g
            .wait_used(0, Duration::from_secs(10))
            .expect("queue 0 goes on once the word is 2");
        assert_eq!(u.id, u32::from(head));
        assert_status(u.completion.expect("completion"), abi::STATUS_OK);
    }
    assert_eq!(g.download(0, dev, 4), [3; 4]);
}

#[test]
fn test_a_wait_sees_the_guest_cpu_write_without_a_doorbell() {
    for mode in [Mode::Interrupt, Mode::Polled] {
        let (_s, mut g) = vgpu(1);
        g.enable_device();
        g.setup_queue(0, 64, mode);
        let word = g.alloc(8, 8);
        let head = g.post(
            0,
            &value_chain(WAIT, abi::WAIT_EQ | abi::VALUE_FLAG_32, word, 9),
        );
        g.kick(0);
        std::thread::sleep(QUIET);
        assert!(
            g.poll_used(0).is_none(),
            "{mode:?}: the wait held its queue"
        );
        // Written by the guest's CPU, as a program writes host memory a
        // stream waits on; no doorbell follows.
        g.write(word, &9u32.to_le_bytes());
        let u = g
            .wait_used(0, Duration::from_secs(10))
            .unwrap_or_else(|| panic!("{mode:?}: the device saw the word"));
        assert_eq!(u.id, u32::from(head));
        assert_status(u.completion.expect("completion"), abi::STATUS_OK);
    }
}

#[test]
fn test_a_reset_ends_a_wait() {
    let (_s, mut g) = vgpu(1);
    g.enable_device();
    g.setup_queue(0, 64, Mode::Interrupt);
    let word = g.alloc(8, 8);
    g.post(0, &value_chain(WAIT, abi::WAIT_GEQ, word, 1));
    g.kick(0);
    std::thread::sleep(QUIET);
    g.device_reset();
    g.forget_queues();
    g.enable_device();
    g.setup_queue(0, 64, Mode::Interrupt);
    assert_status(g.nop(0), abi::STATUS_OK);
}
