//! `waycast-operator`: reconciles Gateways, ModelEndpoints and ApiKeys into
//! gateway fleets. The controller itself is not built yet; this binary only
//! says so, so that nothing mistakes it for a working operator.

use std::process::ExitCode;

fn main() -> ExitCode {
    eprintln!(
        "waycast-operator {}: the controller is not implemented yet; the waycast.dev API ({} kinds) is",
        env!("CARGO_PKG_VERSION"),
        waycast_crds::crds().len()
    );
    ExitCode::FAILURE
}
