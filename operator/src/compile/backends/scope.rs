//! What every backend kind's resolver is given and gives back, and the
//! check every address a team chose is held to (the Gateway's egress rules).

use waycast_crds::egress;

use crate::compile::inputs::Inputs;
use crate::compile::settings::egress_settings;

/// Where one backend is resolved: which of the ModelEndpoint's backends,
/// in which namespace, over TLS or not, against which objects.
#[derive(Clone, Copy)]
pub struct Scope<'a> {
    /// Its place in `spec.backends`.
    pub index: usize,
    /// The ModelEndpoint's namespace: the only one its backends may name.
    pub namespace: &'a str,
    /// Whether the backend has `tls` (then it is reached over `https`).
    pub tls: bool,
    /// What compile reads.
    pub inputs: &'a Inputs<'a>,
}

/// Where a backend's requests go: the config's `url` and `endpoints`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The base URL: scheme, authority, path (and the `Host` sent).
    pub url: String,
    /// The endpoints key of a Service whose ready pods the gateway picks
    /// from (`namespace/name:port`); `None`: requests go to `url`'s host.
    pub endpoints: Option<String>,
}

impl Scope<'_> {
    /// The backend's field, for messages: `spec.backends[2]`.
    pub fn field(&self) -> String {
        format!("spec.backends[{}]", self.index)
    }

    /// `https` with `tls`, else `http`.
    pub fn scheme(&self) -> &'static str {
        if self.tls { "https" } else { "http" }
    }

    /// The Gateway's egress rules for an address a team chose (a `url`, an
    /// ExternalName, a Service without a selector): a host outside its
    /// `allowedHosts`, or an IP literal its policy refuses (denied, or in a
    /// closed range it did not open), is not served. Names are checked
    /// again by the gateway on every address they resolve to.
    ///
    /// # Errors
    /// Why the Gateway does not allow it.
    pub fn egress(&self, url: &str) -> Result<(), String> {
        let inputs = self.inputs;
        let Some(host) = url.parse::<http::Uri>().ok().and_then(|u| u.host().map(str::to_owned)) else {
            return Ok(());
        };
        let allowed_hosts = inputs.gateway.spec.egress.as_ref().map(|e| e.allowed_hosts.as_slice()).unwrap_or_default();
        if !allowed_hosts.is_empty() && !egress::host_allowed(&host, allowed_hosts) {
            return Err(format!("host {host} is not in the Gateway's spec.egress.allowedHosts"));
        }
        let mut settings = waycast_crds::config::Settings::default();
        // An invalid range is the Gateway's own problem, reported on it.
        let _ = egress_settings(inputs, &mut settings);
        let policy = egress::EgressPolicy::from_settings(&settings);
        // A metadata address is the validation's to refuse (Invalid, naming the field).
        let literal = egress::ip_literal(&host).filter(|address| !egress::is_metadata_address(*address));
        match literal.and_then(|address| policy.refuses(&host, address)) {
            Some(why) => Err(why),
            None => Ok(()),
        }
    }
}
