//! The reconcile shells: read from the stores, call the pure compile and
//! render steps, server-side apply the result, and write status.
//!
//! ```text
//! reflectors (Gateway, ModelEndpoint, ApiKey, Namespace, Service, key Secrets,
//!             config Secret metadata, heartbeat Leases) ─► Stores ─► Feeds + change signals
//! key lane:                 a few ApiKeys changed ─► each Gateway's writer: their entries compiled
//!                           alone ─► the shards holding them patched and written, then the manifest
//!                           (key_lane.rs, config_writer.rs)
//! Gateway controller:       stores ─► compile ─► render ─► apply (SSA; prune HPA/PDB) and the config
//!                           handed to the Gateway's writer (config_writer.rs: changed parts, then
//!                           their manifest, old shards emptied; write_order.rs decides) ─► status
//!                           └─ stores every verdict in `compiled`, announces the objects whose
//!                              verdict or Programmed state moved (programmed.rs)
//! key Secret controller:    generate <name>-key if needed (its own queue: never behind status work)
//! ApiKey controller:        verdict from `compiled` per selecting Gateway ─► ApiKey status
//! ModelEndpoint controller: verdict from `compiled` per selecting Gateway ─► ModelEndpoint status
//! AccessGrant controller:   verdict from `compiled` per selecting Gateway ─► AccessGrant status
//! key-set refresher:        each identity provider's JWKS fetched off the reconcile (key_sets.rs);
//!                           a changed one (or fetch error) asks for its Gateway's reconcile
//! ```
//!
//! The controllers read the shared stores and are fed by them (one cache of
//! each kind). Each kind's status is written only by its own controller, with one field
//! manager. A change the operator reads (spec, labels, Secret data — not
//! status) re-triggers the controllers that read it, after the store has it;
//! bursts are coalesced by the debounce, a request for an object already
//! queued is merged, and at most [`CONCURRENCY`] reconciles of a kind run at
//! once. One compile per Gateway change serves every object's status.

mod access_grant;
mod api_key;
mod config_writer;
mod endpoints;
mod gateway;
mod key_compile;
mod key_lane;
mod key_sets;
mod memory;
mod model_endpoint;
mod referenced;
mod shell;
mod statuses;
mod write_order;
mod written_parts;

use std::sync::Arc;

use statuses::status_controller;

use crate::context::Context;

/// Runs the controllers and the key-set refresher until the process ends.
pub async fn run(context: Arc<Context>) {
    // The key sets the pods serve now are held before any Gateway compiles.
    let refresher = key_sets::seeded(&context).await;
    let key_sets = key_sets::keep_key_sets(context.clone(), refresher);
    // Every write of a Gateway's config Secrets is its writer's.
    let writers = Arc::new(config_writer::Writers::new(context.clone()));
    let gateway_controller = gateway::gateway_controller(context.clone(), writers.clone());
    let key_controller = status_controller(
        context.clone(),
        context.stores.keys.clone(),
        &context.stores.feeds.keys,
        api_key::reconcile_api_key,
    );
    let key_secrets = api_key::key_secret_controller(context.clone());
    // Conflicts are decided among all of a Gateway's ModelEndpoints: that
    // too comes from its compile.
    let model_controller = status_controller(
        context.clone(),
        context.stores.models.clone(),
        &context.stores.feeds.models,
        model_endpoint::reconcile_model_endpoint,
    );
    // Grants are selected by the Gateways' `apiKeys` rules and compiled
    // with them: their statuses, too, come from the compiles.
    let grant_controller = status_controller(
        context.clone(),
        context.stores.grants.clone(),
        &context.stores.feeds.grants,
        access_grant::reconcile_access_grant,
    );
    let endpoints = endpoints::follow_endpoints(context.clone());
    let usage = crate::usage::run(context.clone());
    let key_lane = key_lane::key_lane(context.clone(), writers);
    tokio::join!(
        gateway_controller,
        key_controller,
        key_secrets,
        model_controller,
        grant_controller,
        endpoints,
        usage,
        key_lane,
        key_sets
    );
}
