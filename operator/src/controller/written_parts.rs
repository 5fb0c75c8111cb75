//! What a Gateway's config writer wrote of its config Secrets lately, by
//! name: fresher than the store, which shows a write moments later, so a
//! part the lane just patched is not written again by the next whole
//! write, and a part whose write failed is written whatever the store
//! shows.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::render::config_parts::ConfigParts;

/// How long a write noted here is taken over what the store shows: by
/// then the store shows it, or another writer's.
pub const WRITTEN_FRESH_FOR: Duration = Duration::from_secs(10);

/// Each config Secret's digest as last written, and when (`None`: its
/// write failed, what it holds is not known).
#[derive(Debug, Default)]
pub struct WrittenParts {
    by_name: HashMap<String, (Option<String>, Instant)>,
}

impl WrittenParts {
    /// Notes that the Secrets `names` were written at `now` with `parts`'
    /// digests (`None`: their write failed).
    pub fn note<'a>(&mut self, names: impl IntoIterator<Item = &'a str>, parts: Option<&ConfigParts>, now: Instant) {
        let digests: HashMap<&str, &str> = parts
            .into_iter()
            .flat_map(ConfigParts::in_write_order)
            .filter_map(|meta| Some((meta.name.as_deref()?, crate::render::meta::digest_of(meta)?)))
            .collect();
        self.by_name.retain(|_, (_, at)| now.saturating_duration_since(*at) < WRITTEN_FRESH_FOR);
        for name in names {
            let digest = digests.get(name).map(|digest| (*digest).to_owned());
            self.by_name.insert(name.to_owned(), (digest, now));
        }
    }

    /// What was written within [`WRITTEN_FRESH_FOR`] before `now`, by name
    /// (`None`: not known).
    pub fn fresh(&self, now: Instant) -> HashMap<&str, Option<&str>> {
        self.by_name
            .iter()
            .filter(|(_, (_, at))| now.saturating_duration_since(*at) < WRITTEN_FRESH_FOR)
            .map(|(name, (digest, _))| (name.as_str(), digest.as_deref()))
            .collect()
    }

    /// Forgets everything (the Gateway was made again under its name).
    pub fn clear(&mut self) {
        self.by_name.clear();
    }
}

#[cfg(test)]
mod tests {
    use waycast_crds::GatewayConfig;
    use waycast_crds::config::{KeyConfig, ModelConfig};

    use super::*;
    use crate::render::config_parts::{Layout, Layouts, config_parts};
    use crate::render::fixtures;
    use crate::render::meta::digest_of;

    fn parts() -> ConfigParts {
        let mut config = GatewayConfig::empty();
        config.models.push(ModelConfig::to("llama", "http://10.0.0.1/v1"));
        config.keys = (0..40).map(|n| KeyConfig::new(format!("team/key-{n:02}"), format!("{n:064x}"))).collect();
        let salt = "0123456789abcdef";
        let layouts = Layouts { current: Some(Layout { shards: 4, salt: salt.into() }), fresh_salt: salt.into() };
        config_parts(&fixtures::gateway(Default::default()), &config, &layouts).unwrap().unwrap()
    }

    #[test]
    fn what_was_written_is_known_by_name_a_failed_write_as_unknown_and_only_for_a_while() {
        let parts = parts();
        let start = Instant::now();
        let mut written = WrittenParts::default();
        let shard = parts.shards[0].name.clone().unwrap();
        let manifest = parts.manifest.metadata.name.clone().unwrap();
        written.note([shard.as_str(), manifest.as_str()], Some(&parts), start);
        let known = written.fresh(start);
        assert_eq!(known.get(shard.as_str()), Some(&digest_of(&parts.shards[0])));
        assert_eq!(known.get(manifest.as_str()), Some(&Some(parts.hash.as_str())));
        assert_eq!(known.len(), 2, "only what was written");
        written.note([shard.as_str()], None, start + Duration::from_secs(1));
        assert_eq!(written.fresh(start).get(shard.as_str()), Some(&None), "a failed write: not known");
        let at_the_bound = written.fresh(start + WRITTEN_FRESH_FOR);
        assert_eq!(at_the_bound.get(manifest.as_str()), None, "stale once WRITTEN_FRESH_FOR old: {at_the_bound:?}");
        let later = start + WRITTEN_FRESH_FOR + Duration::from_millis(500);
        let known = written.fresh(later);
        assert_eq!(known.len(), 1, "the manifest's write is stale by now, the shard's failure is not: {known:?}");
        assert!(written.fresh(start + Duration::from_secs(12)).is_empty(), "the store is the truth again");
        written.clear();
        assert!(written.fresh(start).is_empty(), "a Gateway made again starts with nothing known");
    }
}
