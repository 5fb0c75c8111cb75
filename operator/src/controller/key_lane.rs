//! The key lane: a change of a few ApiKeys (or of their key Secrets)
//! written as a patch of the shards holding them, ahead of the Gateway's
//! whole reconcile — which still follows, for the statuses and everything
//! else, and stays the authority: what a patch cannot take is left to it.
//!
//! ```text
//! key log (stores::key_log) ─► gathered a moment ─► its position to every Gateway's config writer
//!     ─► each with a kept config (render::key_patch::Kept) of the same spec, no Unknown since:
//!        the changed ApiKeys compiled alone (their key Secrets, selection, checks)
//!        ─► Kept::patch ─► changed shards, then the manifest ─► pods swap
//!     anything else ─► the kept config dropped: the whole reconcile writes, and keeps anew
//! ```
//!
//! At 100,000 keys a whole reconcile is about a second of compile; a
//! patch compiles the changed keys alone and writes one shard. The writes
//! are the Gateway's writer's (`config_writer`), in the order
//! `write_order` decides.

use std::sync::Arc;
use std::time::Duration;

use super::config_writer::Writers;
use crate::context::Context;

/// How long the lane gathers changes before the writers look: an ApiKey
/// and the key Secret made for it land in one patch.
const GATHER: Duration = Duration::from_millis(10);

/// Runs the lane until the process ends.
pub(crate) async fn key_lane(context: Arc<Context>, writers: Arc<Writers>) {
    loop {
        context.stores.key_log.arrived().await;
        tokio::time::sleep(GATHER).await;
        let position = context.stores.key_log.drained().await.position();
        writers.logged(position);
    }
}
