//! Renders `docs/api.md` from the CRD schemas, so the reference can never
//! disagree with what the API server enforces.

use std::fmt::Write as _;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, JSONSchemaProps, JSONSchemaPropsOrArray,
};

/// Fields whose type is a standard Kubernetes type: documented by name and
/// not expanded (their own docs are `kubectl explain`'s).
const KUBERNETES_TYPES: &[(&str, &str)] = &[
    ("resources", "core/v1 ResourceRequirements"),
    ("tolerations", "[]core/v1 Toleration"),
    ("affinity", "core/v1 Affinity"),
    ("topologySpreadConstraints", "[]core/v1 TopologySpreadConstraint"),
    ("selector", "meta/v1 LabelSelector"),
    ("conditions", "[]meta/v1 Condition"),
];

/// The API reference as Markdown.
pub fn api_reference(crds: &[CustomResourceDefinition]) -> String {
    let mut out = String::from(
        "# waycast.dev/v1alpha1 API reference\n\n\
         Generated from the CRD schemas by `make crds`; do not edit. Every field here is also \
         `kubectl explain <kind>.<path>`. Rules marked *CEL* are checked by the API server, \
         which refuses objects that break them.\n",
    );
    for crd in crds {
        let names = &crd.spec.names;
        let Some(version) = crd.spec.versions.first() else {
            continue;
        };
        let Some(schema) = version.schema.as_ref().and_then(|s| s.open_api_v3_schema.as_ref()) else {
            continue;
        };
        let _ = write!(out, "\n## {}\n\n", names.kind);
        if let Some(description) = &schema.description {
            let _ = writeln!(out, "{}\n", description.trim());
        }
        let short = names.short_names.clone().unwrap_or_default().join(", ");
        let _ = writeln!(out, "`kubectl get {}` (short name `{short}`, category `waycast`).\n", names.plural);
        if let Some(columns) = &version.additional_printer_columns {
            let listed: Vec<String> = columns.iter().map(|c| format!("`{}`", c.name.to_uppercase())).collect();
            let _ = writeln!(out, "Columns: {}.\n", listed.join(", "));
        }
        for root in ["spec", "status"] {
            if let Some(part) = schema.properties.as_ref().and_then(|p| p.get(root)) {
                let _ = write!(out, "### {}.{root}\n\n| Field | Type | Description |\n|---|---|---|\n", names.kind);
                for rule in part.x_kubernetes_validations.iter().flatten() {
                    let message = rule.message.as_deref().unwrap_or(&rule.rule);
                    let _ = writeln!(out, "| *CEL* | | {} (`{}`) |", escape(message), escape(&rule.rule));
                }
                fields(&mut out, part, root);
                out.push('\n');
            }
        }
    }
    out
}

fn fields(out: &mut String, schema: &JSONSchemaProps, path: &str) {
    let Some(properties) = &schema.properties else {
        return;
    };
    let required = schema.required.clone().unwrap_or_default();
    for (name, child) in properties {
        let child_path = format!("{path}.{name}");
        let known = KUBERNETES_TYPES.iter().find(|(field, _)| field == name).map(|(_, kind)| *kind);
        let mut type_name = known.map(str::to_owned).unwrap_or_else(|| type_of(child));
        if required.contains(name) {
            type_name.push_str(", required");
        }
        let mut description = child.description.as_deref().unwrap_or("").replace('\n', " ");
        for constraint in constraints(child) {
            let _ = write!(description, " {constraint}.");
        }
        let _ = writeln!(out, "| `{child_path}` | {} | {} |", escape(&type_name), escape(description.trim()));
        if known.is_some() {
            continue;
        }
        let element = match &child.items {
            Some(JSONSchemaPropsOrArray::Schema(items)) => Some(items.as_ref()),
            _ => None,
        };
        if let Some(items) = element {
            for rule in items.x_kubernetes_validations.iter().flatten() {
                let message = rule.message.as_deref().unwrap_or(&rule.rule);
                let _ = writeln!(out, "| `{child_path}[]` *CEL* | | {} |", escape(message));
            }
            fields(out, items, &format!("{child_path}[]"));
        } else {
            for rule in child.x_kubernetes_validations.iter().flatten() {
                let message = rule.message.as_deref().unwrap_or(&rule.rule);
                let _ = writeln!(out, "| `{child_path}` *CEL* | | {} |", escape(message));
            }
            fields(out, child, &child_path);
        }
    }
}

fn type_of(schema: &JSONSchemaProps) -> String {
    let base = schema.type_.clone().unwrap_or_else(|| "object".to_owned());
    match (base.as_str(), &schema.items, &schema.additional_properties) {
        ("array", Some(JSONSchemaPropsOrArray::Schema(items)), _) => {
            format!("[]{}", type_of(items))
        }
        ("object", _, Some(_)) => "map[string]string".to_owned(),
        _ => match &schema.format {
            Some(format) if base == "string" => format!("string ({format})"),
            _ => base,
        },
    }
}

fn constraints(schema: &JSONSchemaProps) -> Vec<String> {
    let mut found = Vec::new();
    if let Some(values) = &schema.enum_ {
        let listed: Vec<String> = values.iter().map(|v| format!("`{}`", v.0.as_str().unwrap_or_default())).collect();
        found.push(format!("One of {}", listed.join(", ")));
    }
    match (schema.minimum, schema.maximum) {
        (Some(min), Some(max)) => found.push(format!("Range {min}–{max}")),
        (Some(min), None) => found.push(format!("At least {min}")),
        _ => {}
    }
    match (schema.min_length, schema.max_length) {
        (Some(min), Some(max)) => found.push(format!("Length {min}–{max}")),
        (None, Some(max)) => found.push(format!("At most {max} characters")),
        _ => {}
    }
    match (schema.min_items, schema.max_items) {
        (Some(min), Some(max)) => found.push(format!("{min}–{max} items")),
        (None, Some(max)) => found.push(format!("At most {max} items")),
        _ => {}
    }
    if let Some(pattern) = &schema.pattern {
        found.push(format!("Pattern `{pattern}`"));
    }
    found
}

fn escape(text: &str) -> String {
    text.replace('|', "\\|")
}
