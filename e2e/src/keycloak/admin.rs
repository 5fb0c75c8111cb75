//! Keycloak's admin REST API and token endpoint, as tests drive them:
//! realms, clients, groups, users, signing keys, tokens.

use std::time::Duration;

use anyhow::{Context as _, ensure};
use http::{Method, StatusCode, header};
use http_body_util::BodyExt as _;
use serde::Deserialize;
use serde_json::{Value, json};

use super::Keycloak;
use super::client::Payload;
use super::spec::{ClientSpec, OldKeys, Tokens, UserSpec};

/// The key provider Keycloak signs RS256 tokens with by default.
const RSA_PROVIDER: &str = "rsa-generated";
const KEY_PROVIDER_TYPE: &str = "org.keycloak.keys.KeyProvider";

impl Keycloak {
    /// Creates the realm `realm`, enabled, with Keycloak's defaults.
    ///
    /// # Errors
    /// Refused (e.g. it exists).
    pub async fn create_realm(&self, realm: &str) -> anyhow::Result<()> {
        self.admin(Method::POST, "", Some(json!({"realm": realm, "enabled": true})), StatusCode::CREATED).await?;
        Ok(())
    }

    /// Sets how long `realm`'s access tokens live (Keycloak's
    /// `accessTokenLifespan`; whole seconds).
    ///
    /// # Errors
    /// Refused.
    pub async fn set_access_token_lifespan(&self, realm: &str, lifespan: Duration) -> anyhow::Result<()> {
        let body = json!({"accessTokenLifespan": lifespan.as_secs()});
        self.admin(Method::PUT, &format!("/{realm}"), Some(body), StatusCode::NO_CONTENT).await?;
        Ok(())
    }

    /// Creates a client in `realm` that grants tokens for passwords (direct
    /// access grants) and, when confidential, for its own credentials; its
    /// access tokens carry `spec.audience` in `aud` and the user's groups,
    /// by name, in `groups`. Returns its id (not its `client_id`).
    ///
    /// # Errors
    /// Refused (e.g. a `client_id` taken).
    pub async fn create_client(&self, realm: &str, spec: &ClientSpec) -> anyhow::Result<String> {
        let mappers = json!([
            {
                "name": "audience",
                "protocol": "openid-connect",
                "protocolMapper": "oidc-audience-mapper",
                "config": {
                    "included.custom.audience": spec.audience,
                    "access.token.claim": "true",
                    "id.token.claim": "false",
                },
            },
            {
                "name": "groups",
                "protocol": "openid-connect",
                "protocolMapper": "oidc-group-membership-mapper",
                "config": {
                    "claim.name": "groups",
                    "full.path": "false",
                    "access.token.claim": "true",
                    "id.token.claim": "true",
                    "userinfo.token.claim": "true",
                },
            },
        ]);
        let body = json!({
            "clientId": spec.client_id,
            "enabled": true,
            "protocol": "openid-connect",
            "publicClient": spec.secret.is_none(),
            "secret": spec.secret,
            "clientAuthenticatorType": "client-secret",
            "standardFlowEnabled": false,
            "directAccessGrantsEnabled": true,
            "serviceAccountsEnabled": spec.secret.is_some(),
            "protocolMappers": mappers,
        });
        self.create(realm, "clients", body).await
    }

    /// Creates the top-level group `name` in `realm`; returns its id.
    ///
    /// # Errors
    /// Refused (e.g. it exists).
    pub async fn create_group(&self, realm: &str, name: &str) -> anyhow::Result<String> {
        self.create(realm, "groups", json!({"name": name})).await
    }

    /// Creates a user in `realm`, enabled, with a permanent password, a
    /// verified email and the groups named; returns its id (`sub`).
    ///
    /// # Errors
    /// Refused (e.g. the username exists, or a group does not).
    pub async fn create_user(&self, realm: &str, spec: &UserSpec) -> anyhow::Result<String> {
        let body = json!({
            "username": spec.username,
            "enabled": true,
            "email": spec.email,
            "emailVerified": true,
            // Keycloak 26's default user profile requires both names.
            "firstName": spec.username,
            "lastName": "Test",
            "groups": spec.groups,
            "credentials": [{"type": "password", "value": spec.password, "temporary": false}],
        });
        self.create(realm, "users", body).await
    }

    /// Adds the user `user_id` to the group `group_id` (ids as the create
    /// calls returned them): tokens issued from now on list it.
    ///
    /// # Errors
    /// Refused (e.g. no such user or group).
    pub async fn add_to_group(&self, realm: &str, user_id: &str, group_id: &str) -> anyhow::Result<()> {
        let path = format!("/{realm}/users/{user_id}/groups/{group_id}");
        self.admin(Method::PUT, &path, None, StatusCode::NO_CONTENT).await?;
        Ok(())
    }

    /// A user's tokens from `realm`'s token endpoint (password grant,
    /// scope `openid`), through `client`.
    ///
    /// # Errors
    /// Refused (wrong password, the client disallows the grant).
    pub async fn password_token(
        &self,
        realm: &str,
        client: &ClientSpec,
        username: &str,
        password: &str,
    ) -> anyhow::Result<Tokens> {
        let mut form = vec![
            ("grant_type", "password"),
            ("client_id", client.client_id.as_str()),
            ("username", username),
            ("password", password),
            ("scope", "openid"),
        ];
        if let Some(secret) = &client.secret {
            form.push(("client_secret", secret));
        }
        self.token(realm, &form).await
    }

    /// A confidential client's own access token (client-credentials
    /// grant): its service account's.
    ///
    /// # Errors
    /// A public client, or refused.
    pub async fn client_credentials_token(&self, realm: &str, client: &ClientSpec) -> anyhow::Result<Tokens> {
        let secret = client.secret.as_deref().context("a public client has no client credentials")?;
        let form = [("grant_type", "client_credentials"), ("client_id", &client.client_id), ("client_secret", secret)];
        self.token(realm, &form).await
    }

    /// Rotates `realm`'s RS256 signing key: a new `rsa-generated` key
    /// provider above every existing one, so new tokens carry its `kid`;
    /// the ones it replaces become `old`. Returns the new `kid`.
    ///
    /// # Errors
    /// A request refused, or the new key not listed.
    pub async fn rotate_signing_key(&self, realm: &str, old: OldKeys) -> anyhow::Result<String> {
        let realm_id = self.admin(Method::GET, &format!("/{realm}"), None, StatusCode::OK).await?["id"]
            .as_str()
            .context("the realm has no id")?
            .to_owned();
        let replaced = self.rs256_providers(realm).await?;
        let priority = replaced.iter().map(|(_, priority)| *priority).max().unwrap_or(0) + 100;
        let component = json!({
            "name": format!("rsa-rotated-{priority}"),
            "providerId": RSA_PROVIDER,
            "providerType": KEY_PROVIDER_TYPE,
            "parentId": realm_id,
            "config": {"priority": [priority.to_string()], "algorithm": ["RS256"]},
        });
        let id = self.create(realm, "components", component).await?;
        let kid = self
            .signing_keys(realm)
            .await?
            .into_iter()
            .find(|key| key.provider_id == id)
            .with_context(|| format!("no RS256 key from the new provider {id}"))?
            .kid;
        for (old_id, _) in replaced {
            let path = format!("/{realm}/components/{old_id}");
            match old {
                OldKeys::Removed => {
                    self.admin(Method::DELETE, &path, None, StatusCode::NO_CONTENT).await?;
                }
                OldKeys::Passive => {
                    let mut component = self.admin(Method::GET, &path, None, StatusCode::OK).await?;
                    component["config"]["active"] = json!(["false"]);
                    self.admin(Method::PUT, &path, Some(component), StatusCode::NO_CONTENT).await?;
                }
            }
        }
        Ok(kid)
    }

    /// Deletes the provider of `realm`'s RS256 key `kid` (the end of a
    /// rotation's grace period): tokens it signed stop verifying.
    ///
    /// # Errors
    /// No such key, or refused.
    pub async fn remove_signing_key(&self, realm: &str, kid: &str) -> anyhow::Result<()> {
        let key = self.signing_keys(realm).await?.into_iter().find(|key| key.kid == kid);
        let provider = key.with_context(|| format!("{realm} has no RS256 key {kid}"))?.provider_id;
        self.admin(Method::DELETE, &format!("/{realm}/components/{provider}"), None, StatusCode::NO_CONTENT).await?;
        Ok(())
    }

    /// `realm`'s RS256 keys as its admin API lists them (active and passive).
    async fn signing_keys(&self, realm: &str) -> anyhow::Result<Vec<KeyMetadata>> {
        #[derive(Deserialize)]
        struct Keys {
            keys: Vec<KeyMetadata>,
        }
        let keys = self.admin(Method::GET, &format!("/{realm}/keys"), None, StatusCode::OK).await?;
        let keys: Keys = serde_json::from_value(keys).context("the realm's keys")?;
        Ok(keys.keys.into_iter().filter(|key| key.algorithm.as_deref() == Some("RS256")).collect())
    }

    /// The enabled, active RS256 key providers of `realm`: `(id, priority)`.
    async fn rs256_providers(&self, realm: &str) -> anyhow::Result<Vec<(String, i64)>> {
        let path = format!("/{realm}/components?type={KEY_PROVIDER_TYPE}");
        let components = self.admin(Method::GET, &path, None, StatusCode::OK).await?;
        let first = |component: &Value, key: &str| component["config"][key][0].as_str().map(str::to_owned);
        Ok(components
            .as_array()
            .context("components are not a list")?
            .iter()
            .filter(|c| c["providerId"] == RSA_PROVIDER)
            .filter(|c| first(c, "algorithm").is_none_or(|a| a == "RS256"))
            .filter(|c| {
                first(c, "enabled").is_none_or(|e| e == "true") && first(c, "active").is_none_or(|a| a == "true")
            })
            .filter_map(|c| {
                let priority = first(c, "priority").and_then(|p| p.parse().ok()).unwrap_or(0);
                Some((c["id"].as_str()?.to_owned(), priority))
            })
            .collect())
    }

    async fn token(&self, realm: &str, form: &[(&str, &str)]) -> anyhow::Result<Tokens> {
        let url = format!("{}/protocol/openid-connect/token", self.issuer(realm));
        let (status, body) = self.http.send(Method::POST, &url, None, Some(Payload::form(form))).await?;
        ensure!(status == StatusCode::OK, "{url} answered {status}: {}", String::from_utf8_lossy(&body));
        serde_json::from_slice(&body).with_context(|| format!("{url}'s answer"))
    }

    /// POSTs `body` to `realm`'s admin collection `what`; returns the new
    /// object's id (the last segment of `Location`).
    async fn create(&self, realm: &str, what: &str, body: Value) -> anyhow::Result<String> {
        let url = format!("{}/admin/realms/{realm}/{what}", self.base);
        let token = self.admin_token().await?;
        let response = self.http.request(Method::POST, &url, Some(&token), Some(Payload::json(&body))).await?;
        let status = response.status();
        let location = response.headers().get(header::LOCATION).and_then(|l| l.to_str().ok()).map(str::to_owned);
        let body = response.into_body().collect().await?.to_bytes();
        ensure!(status == StatusCode::CREATED, "{url} answered {status}: {}", String::from_utf8_lossy(&body));
        let location = location.with_context(|| format!("{url} created without a Location"))?;
        Ok(location.rsplit('/').next().unwrap_or_default().to_owned())
    }

    /// One admin API call on `/admin/realms{path}`, expecting `wanted`;
    /// returns the JSON answer (`null` when empty).
    async fn admin(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
        wanted: StatusCode,
    ) -> anyhow::Result<Value> {
        let url = format!("{}/admin/realms{path}", self.base);
        let token = self.admin_token().await?;
        self.http.expect(method, &url, Some(&token), body.as_ref().map(Payload::json), wanted).await
    }

    /// A fresh admin token each call: they live a minute, and a test may
    /// take longer than that.
    async fn admin_token(&self) -> anyhow::Result<String> {
        let form = [
            ("grant_type", "password"),
            ("client_id", "admin-cli"),
            ("username", self.admin_user.as_str()),
            ("password", self.admin_password.as_str()),
        ];
        Ok(self.token("master", &form).await?.access_token)
    }
}

/// A key as Keycloak's admin API lists it.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct KeyMetadata {
    provider_id: String,
    kid: String,
    algorithm: Option<String>,
}
