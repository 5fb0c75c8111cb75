//! waycast's OTLP/HTTP export, shared by the gateway (request spans and
//! usage records) and the operator (reconcile spans).
//!
//! ```text
//! caller ─► proto::span / proto::record ─► Item ─► Exporter::send (bounded queue, try_send)
//!                                                    └─► thread: batch ─► POST <endpoint>/v1/traces, /v1/logs
//! ```
//!
//! What to record and when is the caller's: this crate encodes, queues,
//! batches and sends, and counts what was exported or dropped on the
//! caller's own counters ([`exporter::Counts`]). It is written on the crates
//! both binaries already link (hyper's client, rustls, prometheus); the
//! OpenTelemetry SDK crates would have added a runtime and an HTTP client of
//! their own (docs/observability.md, "What the crates cost").

mod client;
pub mod destination;
pub mod exporter;
pub mod flags;
pub mod headers;
pub mod ids;
pub mod proto;
pub mod wire;

pub use destination::Destination;
pub use exporter::{Counts, Exporter, Item};
