//! A protocol run as a partition's queued steps, its copies' pieces of
//! forwarded guest memory resolved: for the command loop (`host.rs`,
//! which runs a run whole) and the runner (`runner.rs`, which starts
//! runs and finishes them later).

use vgpu_backend::{OpError, Queued, SliceMemory};

use crate::guest_mem::{Pinned, Table};
use crate::proto;

/// Calls `f` with `steps` as a partition's queued steps, their copies'
/// pieces resolved against `pinned` (so they stay mapped while it is
/// held); refuses a run whose copies go both ways.
pub(crate) fn with_queued<R>(
    pinned: &Pinned<'_>,
    steps: &[proto::Step<'_>],
    f: impl FnOnce(&[Queued<'_>]) -> R,
) -> Result<R, OpError> {
    let (ups, downs) = steps.iter().fold((0, 0), |(u, d), s| match s {
        proto::Step::Upload { .. } => (u + 1, d),
        proto::Step::Download { .. } => (u, d + 1),
        _ => (u, d),
    });
    if ups > 0 && downs > 0 {
        return Err(OpError::Invalid(
            "a queued run moves guest memory one way".into(),
        ));
    }
    let pieces: Vec<proto::MappedPiece> = steps
        .iter()
        .flat_map(|s| match s {
            proto::Step::Upload { src: pieces, .. } | proto::Step::Download { dst: pieces, .. } => {
                pieces.as_slice()
            }
            _ => &[],
        })
        .copied()
        .collect();
    let (slices, _) = Table::resolve_in(pinned, &pieces, downs > 0)?;
    // One slice per piece, in order: each copy takes its own.
    let mut at = 0;
    let mut take = |n: usize| {
        let mine = &slices[at..at + n];
        at += n;
        // SAFETY: resolved against `pinned`, the table's read lock, which
        // the caller holds for as long as the partition may use them
        // (until the run is over), writable mappings for downloads.
        unsafe { SliceMemory::new(mine) }
    };
    let queued: Vec<Queued<'_>> = steps
        .iter()
        .map(|s| match s {
            proto::Step::Timestamp => Queued::Timestamp,
            proto::Step::Launch(l) => Queued::Launch(l.clone()),
            proto::Step::Upload { dst, src: pieces } => Queued::Upload {
                dst: *dst,
                src: take(pieces.len()),
            },
            proto::Step::Download { src, dst: pieces } => Queued::Download {
                src: *src,
                dst: take(pieces.len()),
            },
            proto::Step::Fill(f) => Queued::Fill(*f),
            proto::Step::Copy(c) => Queued::Copy(*c),
        })
        .collect();
    Ok(f(&queued))
}
