//! The one source of the dashboards and alerts: every panel's query and
//! every alert's expression, written once. `super` renders them as the
//! chart's Grafana dashboards and PrometheusRule, and checks each metric
//! name against the gateway's and the operator's registries, so a renamed
//! metric fails `make generate` (and the e2e test, which evaluates every
//! query against a real Prometheus scraping the node's pods).
//!
//! Queries take Grafana's `$__rate_interval`, and the dashboards' `$model`
//! and `$namespace` variables in regex matchers (`=~`).

/// A panel: a title, what it shows, and its queries (expression, legend).
pub struct Panel {
    /// Its title.
    pub title: &'static str,
    /// What it shows (Grafana shows it on hover).
    pub description: &'static str,
    /// Grafana's unit of its values.
    pub unit: &'static str,
    /// Its queries: (expression, legend).
    pub queries: &'static [(&'static str, &'static str)],
}

/// A dashboard: its file, Grafana uid, title, variables and rows of panels.
pub struct Dashboard {
    /// Its file under the chart's `dashboards/`.
    pub file: &'static str,
    /// Grafana's uid for it (stable links).
    pub uid: &'static str,
    /// Its title.
    pub title: &'static str,
    /// What it is for.
    pub description: &'static str,
    /// (name, label query, regex): a Grafana query variable each.
    pub variables: &'static [(&'static str, &'static str, &'static str)],
    /// Its rows: (title, panels).
    pub rows: &'static [(&'static str, &'static [Panel])],
}

/// An alert: its expression, and the part of it that must return data
/// once the gateway has served a load (the expression without its
/// threshold), which the e2e test evaluates.
pub struct Alert {
    /// The alert's name.
    pub name: &'static str,
    /// When it fires.
    pub expr: &'static str,
    /// The expression without its threshold.
    pub probe: &'static str,
    /// How long the expression holds before it fires.
    pub for_: &'static str,
    /// Its `severity` label.
    pub severity: &'static str,
    /// A line for a notification's title.
    pub summary: &'static str,
    /// What it means, with its labels.
    pub description: &'static str,
}

const fn panel(
    title: &'static str,
    description: &'static str,
    unit: &'static str,
    queries: &'static [(&'static str, &'static str)],
) -> Panel {
    Panel { title, description, unit, queries }
}

/// The dashboards: overview, per model, per tenant.
pub const DASHBOARDS: &[Dashboard] = &[
    Dashboard {
        file: "waycast-overview.json",
        uid: "waycast-overview",
        title: "waycast / Overview",
        description: "Every Gateway's traffic, errors, upstream health, config and telemetry.",
        variables: &[],
        rows: &[
            (
                "Traffic",
                &[
                    panel(
                        "Requests by status",
                        "Requests answered per second, by HTTP status code.",
                        "reqps",
                        &[("sum by (code) (rate(waycast_gateway_requests_total[$__rate_interval]))", "{{code}}")],
                    ),
                    panel(
                        "5xx ratio",
                        "Share of requests answered 5xx (the gateway's or an upstream's).",
                        "percentunit",
                        &[(
                            r#"(sum(rate(waycast_gateway_requests_total{code=~"5.."}[$__rate_interval])) or vector(0)) / sum(rate(waycast_gateway_requests_total[$__rate_interval]))"#,
                            "5xx",
                        )],
                    ),
                    panel(
                        "In flight and connections",
                        "Requests being served and client connections open, over every pod.",
                        "short",
                        &[
                            ("sum(waycast_gateway_inflight_requests)", "requests in flight"),
                            ("sum(waycast_gateway_connections_open)", "connections open"),
                        ],
                    ),
                    panel(
                        "Gateway overhead",
                        "Time spent in the gateway itself per request (not the upstream's), p50 and p99.",
                        "s",
                        &[
                            (
                                "histogram_quantile(0.5, sum by (le) (rate(waycast_gateway_overhead_seconds_bucket[$__rate_interval])))",
                                "p50",
                            ),
                            (
                                "histogram_quantile(0.99, sum by (le) (rate(waycast_gateway_overhead_seconds_bucket[$__rate_interval])))",
                                "p99",
                            ),
                        ],
                    ),
                ],
            ),
            (
                "Upstreams",
                &[
                    panel(
                        "Upstream errors",
                        "Upstream failures per second, by model and reason.",
                        "reqps",
                        &[(
                            "sum by (model, reason) (rate(waycast_gateway_upstream_errors_total[$__rate_interval]))",
                            "{{model}} {{reason}}",
                        )],
                    ),
                    panel(
                        "Retries",
                        "Requests sent again to another endpoint before any byte reached the client.",
                        "reqps",
                        &[(
                            "sum by (model, reason) (rate(waycast_gateway_upstream_retries_total[$__rate_interval]))",
                            "{{model}} {{reason}}",
                        )],
                    ),
                    panel(
                        "Ejections",
                        "Endpoints taken out after failures in a row.",
                        "short",
                        &[(
                            "sum by (model) (increase(waycast_gateway_endpoint_ejections_total[$__rate_interval]))",
                            "{{model}}",
                        )],
                    ),
                    panel(
                        "Endpoints known",
                        "Endpoints of the Services the configs route to, per pod.",
                        "short",
                        &[("max(waycast_gateway_endpoints)", "endpoints")],
                    ),
                ],
            ),
            (
                "Config and telemetry",
                &[
                    panel(
                        "Gateway conditions",
                        "Each Gateway's Accepted, Programmed and Ready conditions (1 true).",
                        "short",
                        &[(
                            "min by (gateway, condition) (waycast_operator_gateway_condition)",
                            "{{gateway}} {{condition}}",
                        )],
                    ),
                    panel(
                        "Config propagation",
                        "Writing a config to every pod of its Gateway reporting it, p99.",
                        "s",
                        &[(
                            "histogram_quantile(0.99, sum by (le) (rate(waycast_operator_propagation_seconds_bucket[$__rate_interval])))",
                            "p99",
                        )],
                    ),
                    panel(
                        "Configs served",
                        "Pods serving each config hash, and configs refused.",
                        "short",
                        &[
                            ("count by (hash) (waycast_gateway_config_info)", "{{hash}}"),
                            ("sum(increase(waycast_gateway_config_reload_errors_total[$__rate_interval]))", "refused"),
                        ],
                    ),
                    panel(
                        "Telemetry dropped",
                        "Spans and usage records dropped (collector slow or down), by signal and reason.",
                        "short",
                        &[(
                            "sum by (signal, reason) (rate(waycast_gateway_telemetry_dropped_total[$__rate_interval]))",
                            "{{signal}} {{reason}}",
                        )],
                    ),
                ],
            ),
        ],
    },
    Dashboard {
        file: "waycast-model.json",
        uid: "waycast-model",
        title: "waycast / Model",
        description: "One model: latency to the first token and between tokens, tokens, queueing and its endpoints.",
        variables: &[("model", "label_values(waycast_gateway_requests_total, model)", "")],
        rows: &[
            (
                "Latency",
                &[
                    panel(
                        "Time to first token",
                        "Request arrival to the first response byte (the first token of a stream), p50, p90, p99.",
                        "s",
                        &[
                            (
                                r#"histogram_quantile(0.5, sum by (le) (rate(waycast_gateway_time_to_first_byte_seconds_bucket{model=~"$model"}[$__rate_interval])))"#,
                                "p50",
                            ),
                            (
                                r#"histogram_quantile(0.9, sum by (le) (rate(waycast_gateway_time_to_first_byte_seconds_bucket{model=~"$model"}[$__rate_interval])))"#,
                                "p90",
                            ),
                            (
                                r#"histogram_quantile(0.99, sum by (le) (rate(waycast_gateway_time_to_first_byte_seconds_bucket{model=~"$model"}[$__rate_interval])))"#,
                                "p99",
                            ),
                        ],
                    ),
                    panel(
                        "Time per output token",
                        "Mean time between a stream's tokens after the first, p50 and p99.",
                        "s",
                        &[
                            (
                                r#"histogram_quantile(0.5, sum by (le) (rate(waycast_gateway_time_per_output_token_seconds_bucket{model=~"$model"}[$__rate_interval])))"#,
                                "p50",
                            ),
                            (
                                r#"histogram_quantile(0.99, sum by (le) (rate(waycast_gateway_time_per_output_token_seconds_bucket{model=~"$model"}[$__rate_interval])))"#,
                                "p99",
                            ),
                        ],
                    ),
                    panel(
                        "Request duration",
                        "Arrival to the last response byte, p99.",
                        "s",
                        &[(
                            r#"histogram_quantile(0.99, sum by (le) (rate(waycast_gateway_request_duration_seconds_bucket{model=~"$model"}[$__rate_interval])))"#,
                            "p99",
                        )],
                    ),
                    panel(
                        "Requests by status",
                        "The model's requests per second, by status code.",
                        "reqps",
                        &[(
                            r#"sum by (code) (rate(waycast_gateway_requests_total{model=~"$model"}[$__rate_interval]))"#,
                            "{{code}}",
                        )],
                    ),
                ],
            ),
            (
                "Tokens",
                &[
                    panel(
                        "Tokens per second",
                        "Prompt, completion and cached prompt tokens per second.",
                        "short",
                        &[(
                            r#"sum by (kind) (rate(waycast_gateway_tokens_total{model=~"$model"}[$__rate_interval]))"#,
                            "{{kind}}",
                        )],
                    ),
                    panel(
                        "Tokens per request",
                        "A request's prompt and completion tokens, p50 and p99.",
                        "short",
                        &[
                            (
                                r#"histogram_quantile(0.5, sum by (le, kind) (rate(waycast_gateway_tokens_per_request_bucket{model=~"$model"}[$__rate_interval])))"#,
                                "{{kind}} p50",
                            ),
                            (
                                r#"histogram_quantile(0.99, sum by (le, kind) (rate(waycast_gateway_tokens_per_request_bucket{model=~"$model"}[$__rate_interval])))"#,
                                "{{kind}} p99",
                            ),
                        ],
                    ),
                ],
            ),
            (
                "Queueing and endpoints",
                &[
                    panel(
                        "Queue depth",
                        "Requests waiting for a full model (one with a capacity), by class.",
                        "short",
                        &[(r#"sum by (class) (waycast_gateway_queue_depth{model=~"$model"})"#, "{{class}}")],
                    ),
                    panel(
                        "Queue wait",
                        "Time requests waited for their turn, p99 by class.",
                        "s",
                        &[(
                            r#"histogram_quantile(0.99, sum by (le, class) (rate(waycast_gateway_queue_wait_seconds_bucket{model=~"$model"}[$__rate_interval])))"#,
                            "{{class}} p99",
                        )],
                    ),
                    panel(
                        "Queue refusals",
                        "Requests the full model's queue answered 429, by reason.",
                        "reqps",
                        &[(
                            r#"sum by (reason) (rate(waycast_gateway_queue_shed_total{model=~"$model"}[$__rate_interval]))"#,
                            "{{reason}}",
                        )],
                    ),
                    panel(
                        "Endpoints in flight",
                        "Requests in flight to each endpoint of the Services routed to.",
                        "short",
                        &[("sum by (service, endpoint) (waycast_gateway_endpoint_requests_in_flight)", "{{endpoint}}")],
                    ),
                    panel(
                        "Endpoint response",
                        "Request sent to response headers per endpoint (its queue and prefill), p99.",
                        "s",
                        &[(
                            "histogram_quantile(0.99, sum by (le, endpoint) (rate(waycast_gateway_endpoint_response_seconds_bucket[$__rate_interval])))",
                            "{{endpoint}}",
                        )],
                    ),
                ],
            ),
        ],
    },
    Dashboard {
        file: "waycast-tenant.json",
        uid: "waycast-tenant",
        title: "waycast / Tenant",
        description: "One namespace's keys: requests, tokens, cost, budgets, limits and queueing.",
        variables: &[("namespace", "label_values(waycast_gateway_requests_total, key)", "/^([^/]+)\\//")],
        rows: &[
            (
                "Usage",
                &[
                    panel(
                        "Requests by key",
                        "The namespace's requests per second, by key.",
                        "reqps",
                        &[(
                            r#"sum by (key) (rate(waycast_gateway_requests_total{key=~"($namespace)/.*"}[$__rate_interval]))"#,
                            "{{key}}",
                        )],
                    ),
                    panel(
                        "Tokens per second",
                        "The namespace's tokens per second, by kind.",
                        "short",
                        &[(
                            r#"sum by (namespace, kind) (label_replace(rate(waycast_gateway_tokens_total{key=~"($namespace)/.*"}[$__rate_interval]), "namespace", "$1", "key", "([^/]+)/.*"))"#,
                            "{{namespace}} {{kind}}",
                        )],
                    ),
                    panel(
                        "Cost per hour",
                        "What the namespace's requests of priced models cost per hour, by currency.",
                        "short",
                        &[(
                            r#"sum by (namespace, currency) (label_replace(rate(waycast_gateway_cost_nanos_total{key=~"($namespace)/.*"}[$__rate_interval]), "namespace", "$1", "key", "([^/]+)/.*")) * 3600 / 1e9"#,
                            "{{namespace}} {{currency}}",
                        )],
                    ),
                ],
            ),
            (
                "Budgets, limits and queueing",
                &[
                    panel(
                        "Budgets used",
                        "Budgets of the namespace and its keys half spent or more (1 is all of it).",
                        "percentunit",
                        &[(
                            r#"max by (scope, period) (waycast_gateway_budget_used_ratio{scope=~"key:($namespace)/.*|tenant:($namespace)"})"#,
                            "{{scope}} {{period}}",
                        )],
                    ),
                    panel(
                        "Refused by limits and budgets",
                        "Requests refused by a rate limit or a budget, by key and the limit.",
                        "reqps",
                        &[(
                            r#"sum by (key, decision) (rate(waycast_gateway_rate_limit_requests_total{key=~"($namespace)/.*", decision!="admitted"}[$__rate_interval]))"#,
                            "{{key}} {{decision}}",
                        )],
                    ),
                    panel(
                        "Queue refusals",
                        "The namespace's requests a full model's queue answered 429, by model and reason.",
                        "reqps",
                        &[(
                            r#"sum by (model, reason) (rate(waycast_gateway_queue_shed_total{namespace=~"$namespace"}[$__rate_interval]))"#,
                            "{{model}} {{reason}}",
                        )],
                    ),
                ],
            ),
        ],
    },
];

/// The alerts. The burn-rate alert's objective: 99 % of first tokens
/// within 2.5 s (a bucket bound of the histogram), paged at 14.4 times the
/// sustainable rate over both an hour and 5 minutes (2 % of a 30-day
/// budget in an hour).
pub const ALERTS: &[Alert] = &[
    Alert {
        name: "WaycastConfigRefused",
        expr: "increase(waycast_gateway_config_reload_errors_total[10m]) > 0",
        probe: "increase(waycast_gateway_config_reload_errors_total[10m])",
        for_: "0m",
        severity: "warning",
        summary: "A gateway pod refused a config",
        description: "Pod {{ $labels.instance }} refused a new config in the last 10 minutes and serves the one before it; the Gateway's Programmed condition says why.",
    },
    Alert {
        name: "WaycastGatewayNotAccepted",
        expr: r#"waycast_operator_gateway_condition{condition="Accepted"} == 0"#,
        probe: r#"waycast_operator_gateway_condition{condition="Accepted"}"#,
        for_: "5m",
        severity: "warning",
        summary: "A Gateway's spec is refused",
        description: "Gateway {{ $labels.gateway }} is not Accepted: its spec or a setting it names is refused (kubectl describe gateway).",
    },
    Alert {
        name: "WaycastGatewayNotProgrammed",
        expr: r#"waycast_operator_gateway_condition{condition="Programmed"} == 0"#,
        probe: r#"waycast_operator_gateway_condition{condition="Programmed"}"#,
        for_: "10m",
        severity: "critical",
        summary: "A Gateway's pods do not serve its config",
        description: "Gateway {{ $labels.gateway }} has not been Programmed for 10 minutes: its pods do not all serve the config written for it.",
    },
    Alert {
        name: "WaycastUpstreamErrorRatio",
        expr: "sum by (model) (rate(waycast_gateway_upstream_errors_total[5m])) / sum by (model) (rate(waycast_gateway_requests_total[5m])) > 0.05",
        probe: "sum by (model) (rate(waycast_gateway_upstream_errors_total[5m])) / sum by (model) (rate(waycast_gateway_requests_total[5m]))",
        for_: "5m",
        severity: "warning",
        summary: "Upstream errors above 5 %",
        description: "{{ $value | humanizePercentage }} of model {{ $labels.model }}'s requests failed upstream over 5 minutes.",
    },
    Alert {
        name: "WaycastEndpointEjections",
        expr: "sum by (model) (increase(waycast_gateway_endpoint_ejections_total[10m])) > 3",
        probe: "sum by (model) (increase(waycast_gateway_endpoint_ejections_total[10m]))",
        for_: "0m",
        severity: "warning",
        summary: "Inference endpoints ejected again and again",
        description: "Endpoints of model {{ $labels.model }} were ejected {{ $value }} times in 10 minutes (failures in a row).",
    },
    Alert {
        name: "WaycastQueueTimeouts",
        expr: r#"sum by (model, namespace) (increase(waycast_gateway_queue_shed_total{reason="timeout"}[10m])) > 0"#,
        probe: r#"sum by (model, namespace) (increase(waycast_gateway_queue_shed_total{reason="timeout"}[10m]))"#,
        for_: "5m",
        severity: "warning",
        summary: "Requests time out waiting for a full model",
        description: "Requests of namespace {{ $labels.namespace }} waited past maxWait for model {{ $labels.model }}: its capacity is too small for its load.",
    },
    Alert {
        name: "WaycastBudgetAt80Percent",
        expr: "max by (scope, period) (waycast_gateway_budget_used_ratio) >= 0.8",
        probe: "max by (scope, period) (waycast_gateway_budget_used_ratio)",
        for_: "0m",
        severity: "info",
        summary: "A budget is 80 % spent",
        description: "The {{ $labels.period }} budget of {{ $labels.scope }} is {{ $value | humanizePercentage }} spent.",
    },
    Alert {
        name: "WaycastTimeToFirstTokenBurn",
        expr: r#"(1 - sum by (model) (rate(waycast_gateway_time_to_first_byte_seconds_bucket{le="2.5"}[1h])) / sum by (model) (rate(waycast_gateway_time_to_first_byte_seconds_count[1h]))) / 0.01 > 14.4 and (1 - sum by (model) (rate(waycast_gateway_time_to_first_byte_seconds_bucket{le="2.5"}[5m])) / sum by (model) (rate(waycast_gateway_time_to_first_byte_seconds_count[5m]))) / 0.01 > 14.4"#,
        probe: r#"(1 - sum by (model) (rate(waycast_gateway_time_to_first_byte_seconds_bucket{le="2.5"}[1h])) / sum by (model) (rate(waycast_gateway_time_to_first_byte_seconds_count[1h]))) / 0.01"#,
        for_: "2m",
        severity: "critical",
        summary: "Time to first token burns its objective fast",
        description: "Model {{ $labels.model }} spends its time-to-first-token error budget (99 % within 2.5 s) at over 14.4 times the sustainable rate in both the last hour and 5 minutes.",
    },
];
