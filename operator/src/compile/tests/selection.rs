//! Which objects a Gateway takes (two-way consent) and whose keys may call a model.

use super::*;

#[test]
fn namespace_selectors_pick_team_namespaces() {
    let mut world = World::quickstart();
    world.gateway = gateway("platform", GatewaySpec::default());
    let teams = RouteSelector {
        namespaces: Some(NamespacePolicy {
            from: NamespaceFrom::Selector,
            selector: Some(LabelSelector {
                match_labels: Some([("waycast.dev/team".to_owned(), "enabled".to_owned())].into()),
                ..LabelSelector::default()
            }),
        }),
        selector: None,
    };
    world.gateway.spec.model_endpoints = Some(teams.clone());
    world.gateway.spec.api_keys = Some(teams);
    for model in &mut world.models {
        model.spec.parent_refs = parent("platform", "gw");
    }
    for key in &mut world.keys {
        key.spec.parent_refs = parent("platform", "gw");
    }
    let compiled = world.compile();
    assert!(compiled.config.models.is_empty() && compiled.config.keys.is_empty(), "demo is not a team namespace");
    world.namespaces = vec![namespace("demo", &[("waycast.dev/team", "enabled")])];
    let compiled = world.compile();
    assert_eq!((compiled.config.models.len(), compiled.config.keys.len()), (1, 1));
}

/// Two-way consent: a Gateway in any namespace with `from: All` takes only
/// what names it; what names it from a namespace it does not admit is not
/// served either.
#[test]
fn a_gateway_takes_only_objects_that_name_it_from_namespaces_it_admits() {
    let mut world = World::quickstart();
    world.gateway = gateway("rogue", GatewaySpec::default());
    let all = RouteSelector {
        namespaces: Some(NamespacePolicy { from: NamespaceFrom::All, selector: None }),
        selector: None,
    };
    world.gateway.spec.model_endpoints = Some(all.clone());
    world.gateway.spec.api_keys = Some(all);
    let compiled = world.compile();
    assert!(compiled.config.models.is_empty() && compiled.config.keys.is_empty());
    assert!(compiled.models.is_empty() && compiled.keys.is_empty(), "no verdicts: it is no one's parent");
    world.models[0].spec.parent_refs = parent("rogue", "gw");
    world.keys[0].spec.parent_refs = parent("rogue", "gw");
    let compiled = world.compile();
    assert_eq!((compiled.config.models.len(), compiled.config.keys.len()), (1, 1), "named: served");
    world.gateway.spec.model_endpoints = None;
    world.gateway.spec.api_keys = None;
    let compiled = world.compile();
    assert!(compiled.config.models.is_empty() && compiled.config.keys.is_empty(), "named, but not admitted");
}

/// Whose keys may call a model: the model's namespace by default, every
/// namespace with `All`, labelled namespaces with `Selector`.
#[test]
fn model_visibility_becomes_key_namespaces() {
    use waycast_crds::model_endpoint::ModelVisibility;
    let mut world = World::quickstart();
    world.namespaces.extend([namespace("team-a", &[("share", "yes")]), namespace("team-b", &[])]);
    let visible = |world: &World| world.compile().config.models[0].key_namespaces.clone();
    assert_eq!(visible(&world), Some(vec!["demo".to_owned()]));
    let policy = |from, selector: Option<&str>| {
        Some(ModelVisibility {
            namespaces: Some(NamespacePolicy {
                from,
                selector: selector.map(|value| LabelSelector {
                    match_labels: Some([("share".to_owned(), value.to_owned())].into()),
                    ..LabelSelector::default()
                }),
            }),
        })
    };
    world.models[0].spec.api_keys = policy(NamespaceFrom::All, None);
    assert_eq!(visible(&world), None);
    world.models[0].spec.api_keys = policy(NamespaceFrom::Selector, Some("yes"));
    assert_eq!(visible(&world), Some(vec!["team-a".to_owned()]));
}
