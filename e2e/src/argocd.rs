//! Runs the ArgoCD health checks the chart ships
//! (`charts/waycast/argocd/health-checks.yaml`) the way ArgoCD does: the
//! Lua script with the object as the global `obj`, in a Lua 5.1 interpreter
//! (Debian's `lua5.1`; ArgoCD embeds a Lua 5.1 VM).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context as _, bail};
use serde_json::Value;

/// The health-check ConfigMap, relative to the repository root.
pub const HEALTH_CHECKS: &str = "charts/waycast/argocd/health-checks.yaml";

/// What a health check returned: ArgoCD's status and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Health {
    /// Healthy, Progressing, Degraded, Suspended, Missing or Unknown.
    pub status: String,
    /// The message ArgoCD shows next to it.
    pub message: String,
}

/// The health scripts by kind (`Gateway`, `ModelEndpoint`, `ApiKey`), read
/// from the ConfigMap's `resource.customizations.health.waycast.dev_<Kind>`
/// entries.
///
/// # Errors
/// The file is unreadable or not a ConfigMap with string data.
pub fn health_scripts(repository: &Path) -> anyhow::Result<BTreeMap<String, String>> {
    let path = repository.join(HEALTH_CHECKS);
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let config_map: Value = serde_yaml_ng::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    let data = config_map.get("data").and_then(Value::as_object).context("the ConfigMap has no data")?;
    let mut scripts = BTreeMap::new();
    for (key, script) in data {
        let Some(kind) = key.strip_prefix("resource.customizations.health.waycast.dev_") else { continue };
        let script = script.as_str().with_context(|| format!("{key} is not a string"))?;
        scripts.insert(kind.to_owned(), script.to_owned());
    }
    Ok(scripts)
}

/// Runs `script` on `object` with `lua5.1`.
///
/// # Errors
/// The interpreter is missing or the script fails.
pub fn run_health_check(script: &str, object: &Value) -> anyhow::Result<Health> {
    // ArgoCD runs the script as a chunk whose `return` is the result; a
    // function wrapper gives the same shape here.
    let mut program = String::from("obj = ");
    lua_literal(object, &mut program);
    program.push_str("\nlocal function health()\n");
    program.push_str(script);
    program
        .push_str("\nend\nlocal hs = health()\nio.write(tostring(hs.status), \"\\n\", tostring(hs.message or \"\"))\n");
    let output = Command::new(lua_interpreter())
        .args(["-e", &program])
        .output()
        .context("running lua5.1 (install it with e2e/scripts/install-node-deps.sh)")?;
    if !output.status.success() {
        bail!("the health check failed: {}", String::from_utf8_lossy(&output.stderr));
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    let (status, message) = stdout.split_once('\n').unwrap_or((&stdout, ""));
    Ok(Health { status: status.to_owned(), message: message.to_owned() })
}

fn lua_interpreter() -> PathBuf {
    std::env::var_os("WAYCAST_LUA").map_or_else(|| PathBuf::from("lua5.1"), PathBuf::from)
}

/// Writes `value` as a Lua table constructor, the way ArgoCD hands objects
/// to scripts: objects become tables keyed by field name, arrays 1-based
/// sequences, `null` nil.
fn lua_literal(value: &Value, out: &mut String) {
    match value {
        Value::Null => out.push_str("nil"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => out.push_str(&n.to_string()),
        Value::String(s) => lua_string(s, out),
        Value::Array(items) => {
            out.push('{');
            for item in items {
                lua_literal(item, out);
                out.push(',');
            }
            out.push('}');
        }
        Value::Object(fields) => {
            out.push('{');
            for (name, field) in fields {
                out.push('[');
                lua_string(name, out);
                out.push_str("]=");
                lua_literal(field, out);
                out.push(',');
            }
            out.push('}');
        }
    }
}

fn lua_string(text: &str, out: &mut String) {
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_ascii_control() => {
                let _ = write!(out, "\\{:03}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
}
