//! Streams and events, each behind a handle: the table of them that
//! [`crate::objects::Objects`] holds, with what stream order reads of
//! each.

use std::collections::HashMap;

use crate::cu::{self, CUdevice};
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
    /// Streams, by handle (the default streams are not filed).
    pub streams: Handles<Stream>,
    /// Events, by handle.
    pub events: Handles<Event>,
}
