//! A provider that names people by `email` refuses a token whose issuer
//! says the address is unverified; any other user claim ignores the claim.

use super::*;

#[test]
fn an_email_the_issuer_says_is_unverified_is_refused() {
    let signer = rsa_signer();
    // `provider` names the person by `email`.
    let corp = provider([&signer.jwk]);
    let check = |changes: Value| verify(&token(&signer, &claims_with(changes)), &corp, now()).map(|v| v.user);
    let served = Ok("ada@example.com".into());
    let rows = [
        (json!({"email_verified": true}), served.clone()),
        (json!({"email_verified": "true"}), served.clone()),
        // Entra ID sends no email_verified: served (docs/identity.md).
        (json!({"email_verified": null}), served.clone()),
        (json!({"email_verified": false}), Err(Refusal::EmailNotVerified)),
        (json!({"email_verified": "false"}), Err(Refusal::EmailNotVerified)),
        (json!({"email_verified": "yes"}), Err(Refusal::MalformedToken)),
        (json!({"email_verified": 0}), Err(Refusal::MalformedToken)),
        // Checked after the claims that come first in the table.
        (json!({"email_verified": false, "aud": "someone-else"}), Err(Refusal::WrongAudience)),
        (json!({"email_verified": false, "email": null}), Err(Refusal::MissingClaim)),
    ];
    for (changes, expected) in rows {
        assert_eq!(check(changes.clone()), expected, "{changes}");
    }
    // Given twice, it could mean one thing here and another to the issuer.
    let twice =
        format!(r#"{{"email_verified":true,{}"#, &claims_with(json!({"email_verified": false})).to_string()[1..]);
    let token = token_of(&signer, &header(&signer).to_string(), &twice);
    assert_eq!(verify(&token, &corp, now()).map(|_| ()), Err(Refusal::MalformedToken));
}

#[test]
fn email_verified_is_not_read_for_another_user_claim() {
    let signer = ec_signer();
    let by_sub = Provider::new("corp", ISSUER, &["waycast"], "sub", Some("groups"), key_set([&signer.jwk])).unwrap();
    for value in [json!(false), json!("no"), json!(7)] {
        let token = token(&signer, &claims_with(json!({ "email_verified": value })));
        assert_eq!(verify(&token, &by_sub, now()).unwrap().user.as_ref(), "f81d4fae", "{value}");
    }
}
