//! Streams and events, each behind a handle: the table of them that
//! [`crate::objects::Objects`] holds, with what stream order reads of
//! each.

use std::collections::HashMap;

use crate::cu::{self, CUdevice, CuResult};
use crate::handles::Handles;

/// A stream. Its work runs in order on its device's queue
/// ([`crate::inflight`]).
pub struct Stream {
    /// The context it was created in.
    pub ctx: usize,
    /// The lane of its device its work goes to.
    pub lane: usize,
    /// The `CUstream_flags` it was created with.
    pub flags: u32,
    /// The priority it was created with.
    pub priority: i32,
    /// Launch attributes set on it (`cuStreamSetAttribute`), by id: hints
    /// the device honours by ignoring, read back as set.
    pub attrs: HashMap<u32, cu::CUlaunchAttributeValue>,
}

/// An event: a marker in the device's queue that reads the device clock
/// when the work before it is done.
pub struct Event {
    /// The `CUevent_flags` it was created with.
    pub flags: u32,
    /// Records so far (0: never recorded), and the device of the last.
    pub records: u64,
    /// The device of its last record.
    pub device: CUdevice,
    /// The lane of the last record.
    pub lane: usize,
    /// The graph whose capture made the last record, if one did: a
    /// stream that waits on the event joins that capture.
    pub captured: Option<usize>,
}

/// The streams and events a program created.
#[derive(Default)]
pub struct Streams {
    streams: Handles<Stream>,
    events: Handles<Event>,
}

impl Streams {
    /// Stream `h` (not one of the default streams, which are not filed).
    pub fn stream(&self, h: usize) -> CuResult<&Stream> {
        self.streams.get(h)
    }

    /// Stream `h`, to change.
    pub fn stream_mut(&mut self, h: usize) -> CuResult<&mut Stream> {
        self.streams.get_mut(h)
    }

    /// Whether `h` is a stream created and not destroyed.
    pub fn has_stream(&self, h: usize) -> bool {
        self.streams.contains(h)
    }

    /// Files `stream` under the fresh handle `h`.
    pub fn add_stream(&mut self, h: usize, stream: Stream) {
        self.streams.insert(h, stream);
    }

    /// Forgets stream `h`.
    pub fn remove_stream(&mut self, h: usize) -> CuResult<Stream> {
        self.streams.remove(h)
    }

    /// Event `h`.
    pub fn event(&self, h: usize) -> CuResult<&Event> {
        self.events.get(h)
    }

    /// Event `h`, to change.
    pub fn event_mut(&mut self, h: usize) -> CuResult<&mut Event> {
        self.events.get_mut(h)
    }

    /// Files `event` under the fresh handle `h`.
    pub fn add_event(&mut self, h: usize, event: Event) {
        self.events.insert(h, event);
    }

    /// Forgets event `h`.
    pub fn remove_event(&mut self, h: usize) -> CuResult<Event> {
        self.events.remove(h)
    }
}
