//! The order of a Gateway's config writes: what its writer
//! (`config_writer`) does with a whole reconcile's config, and with a key
//! change the lane logged, given what it already wrote. Pure: the writer
//! is its one caller, the tests below its specification.
//!
//! ```text
//! whole config read at p ─► keys changed since p? ─► none: write it, keep it from now
//!                                                  ─► a few, and it can be kept: patch them in, write, keep from now
//!                                                  ─► not known, or too many: write it as read, keep it from p
//!                                 (unless the lane wrote after p: that write would undo the lane's ─► compile again)
//! key log at q, a config kept from b < q ─► same Gateway spec, the keys changed in (b, q] known and few: patch them
//!                                         ─► else: drop the kept config (the whole reconcile the change triggered writes)
//! ```

/// The most ApiKeys one patch takes: more (a namespace deleted, say) are
/// the whole reconcile's, which compiles every key anyway.
pub const MOST_KEYS_PER_PATCH: usize = 4096;

/// A whole reconcile's config as it reaches the writer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WholeArrives {
    /// Whether it can be kept to patch: it fits its Secrets, nothing was
    /// left out, no two keys share a digest, no namespace's keys are capped.
    pub keepable: bool,
    /// Whether the writer wrote a lane patch logged after the reconcile
    /// read its inputs.
    pub lane_wrote_since_read: bool,
    /// How many ApiKeys changed since it read its inputs (`None`: not
    /// known — a change that names no key, or the log no longer reaches
    /// back that far).
    pub changed_since_read: Option<usize>,
}

/// Where a kept config's patches start from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeepFrom {
    /// Not kept: the next change waits for a whole reconcile.
    Nothing,
    /// The position the reconcile read its inputs at: the lane patches
    /// what was logged since.
    Read,
    /// The log's position now (every change logged is in it).
    Now,
}

/// What the writer does with a whole reconcile's config.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WholeStep {
    /// Write it as compiled.
    Write(KeepFrom),
    /// Compile the changed ApiKeys alone, patch them in, write it and keep
    /// it from now; when the patch is refused, `otherwise`.
    PatchIn { otherwise: Refused },
    /// Write nothing: it would undo what the lane wrote since the
    /// reconcile read; the reconcile compiles again.
    CompileAgain,
}

/// What follows a refused patch of the changed keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// Write it as compiled, kept for nothing.
    WriteUnkept,
    /// Compile again.
    CompileAgain,
}

/// Whether the lane wrote a patch a whole config read from `read_started`
/// on may not hold: one whose inputs were read after that (`lane_read_by`:
/// when the last patch written had read them). NB: by time, not by log
/// position: a patch compiles its keys from the stores as they are when it
/// runs, which may be past the position it was handed.
pub fn lane_wrote_since(lane_read_by: Option<std::time::Instant>, read_started: std::time::Instant) -> bool {
    lane_read_by.is_some_and(|read_by| read_by > read_started)
}

/// What the writer does with a whole reconcile's config.
pub fn whole_step(arrives: WholeArrives) -> WholeStep {
    let WholeArrives { keepable, lane_wrote_since_read, changed_since_read } = arrives;
    let keep = if keepable { KeepFrom::Now } else { KeepFrom::Nothing };
    match changed_since_read {
        Some(0) => WholeStep::Write(keep),
        Some(changed) if changed <= MOST_KEYS_PER_PATCH => {
            let otherwise = if lane_wrote_since_read { Refused::CompileAgain } else { Refused::WriteUnkept };
            match (keepable, otherwise) {
                (true, _) => WholeStep::PatchIn { otherwise },
                (false, Refused::CompileAgain) => WholeStep::CompileAgain,
                (false, Refused::WriteUnkept) => WholeStep::Write(KeepFrom::Nothing),
            }
        }
        // Written as read: the changes since have their own reconcile
        // coming, or the lane patches them from the read position.
        _ if lane_wrote_since_read => WholeStep::CompileAgain,
        _ => WholeStep::Write(if keepable { KeepFrom::Read } else { KeepFrom::Nothing }),
    }
}

/// The key log as the writer of a kept config finds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeysLogged<'a> {
    /// The Gateway (uid, generation) the kept config was compiled for.
    pub kept_for: &'a (String, i64),
    /// The position the kept config includes.
    pub kept_at: u64,
    /// The Gateway as the store holds it now (`None`: gone).
    pub gateway_now: Option<&'a (String, i64)>,
    /// The log's position now.
    pub logged_at: u64,
    /// How many ApiKeys changed in between (`None`: not known).
    pub changed: Option<usize>,
}

/// What the writer of a kept config does with what the key log holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LaneStep {
    /// Nothing was logged past the kept config.
    Nothing,
    /// What was logged changes no key it serves: it now includes it.
    Advance,
    /// Compile the changed ApiKeys alone, patch and write them.
    Patch,
    /// Let the kept config go: a whole reconcile writes next.
    Drop(DropWhy),
}

/// Why a kept config is let go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DropWhy {
    /// The Gateway is gone.
    Gone,
    /// Its spec (or uid) changed: the reconcile that triggered compiles it.
    NewSpec,
    /// Something no key names changed, or the log no longer reaches back.
    NotKnown,
    /// More keys changed than a patch takes.
    TooMany,
}

/// What the writer of a kept config does with the key log.
pub fn lane_step(logged: &KeysLogged<'_>) -> LaneStep {
    if logged.kept_at >= logged.logged_at {
        return LaneStep::Nothing;
    }
    match (logged.gateway_now, logged.changed) {
        (None, _) => LaneStep::Drop(DropWhy::Gone),
        (Some(now), _) if now != logged.kept_for => LaneStep::Drop(DropWhy::NewSpec),
        (Some(_), None) => LaneStep::Drop(DropWhy::NotKnown),
        (Some(_), Some(0)) => LaneStep::Advance,
        (Some(_), Some(changed)) if changed > MOST_KEYS_PER_PATCH => LaneStep::Drop(DropWhy::TooMany),
        (Some(_), Some(_)) => LaneStep::Patch,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn whole(keepable: bool, lane_wrote: bool, changed: Option<usize>) -> WholeStep {
        whole_step(WholeArrives { keepable, lane_wrote_since_read: lane_wrote, changed_since_read: changed })
    }

    #[test]
    fn a_whole_config_is_written_kept_or_compiled_again() {
        use KeepFrom::{Nothing, Now, Read};
        use WholeStep::{CompileAgain, PatchIn, Write};
        let many = Some(MOST_KEYS_PER_PATCH + 1);
        let rows: &[(bool, bool, Option<usize>, WholeStep)] = &[
            // Nothing changed since the read: written; kept when it can be.
            (true, false, Some(0), Write(Now)),
            (false, false, Some(0), Write(Nothing)),
            (true, true, Some(0), Write(Now)),
            (false, true, Some(0), Write(Nothing)),
            // A few keys changed: patched in when it can be kept.
            (true, false, Some(3), PatchIn { otherwise: Refused::WriteUnkept }),
            (true, true, Some(3), PatchIn { otherwise: Refused::CompileAgain }),
            (true, true, Some(MOST_KEYS_PER_PATCH), PatchIn { otherwise: Refused::CompileAgain }),
            // ... or written as compiled when the lane did not write since.
            (false, false, Some(3), Write(Nothing)),
            // Written over the lane's patches it would undo them.
            (false, true, Some(3), CompileAgain),
            (true, true, None, CompileAgain),
            (true, true, many, CompileAgain),
            (false, true, None, CompileAgain),
            // Not known or too many, the lane silent: written as read; the
            // lane patches from the read position.
            (true, false, None, Write(Read)),
            (true, false, many, Write(Read)),
            (false, false, None, Write(Nothing)),
            (false, false, many, Write(Nothing)),
        ];
        for (keepable, lane_wrote, changed, expected) in rows {
            assert_eq!(
                whole(*keepable, *lane_wrote, *changed),
                *expected,
                "keepable {keepable}, lane wrote {lane_wrote}, changed {changed:?}"
            );
        }
    }

    #[test]
    fn a_patch_whose_inputs_were_read_after_a_whole_began_to_read_counts_as_since() {
        let start = std::time::Instant::now();
        let later = start + std::time::Duration::from_millis(5);
        assert!(!lane_wrote_since(None, start), "no patch written");
        assert!(!lane_wrote_since(Some(start), later), "read before the whole began to read: it saw the same");
        // A patch handed position 10 that read a disable logged at 10 after
        // a whole noted 10: the positions tie, the times do not.
        assert!(lane_wrote_since(Some(later), start));
    }

    #[test]
    fn a_kept_config_is_patched_only_for_its_own_spec_and_known_keys() {
        let kept_for = ("uid-1".to_owned(), 3);
        let next_generation = ("uid-1".to_owned(), 4);
        let made_again = ("uid-2".to_owned(), 3);
        let logged = |gateway_now, kept_at, changed| KeysLogged {
            kept_for: &kept_for,
            kept_at,
            gateway_now,
            logged_at: 10,
            changed,
        };
        let rows: &[(KeysLogged<'_>, LaneStep)] = &[
            (logged(Some(&kept_for), 10, Some(2)), LaneStep::Nothing),
            (logged(Some(&kept_for), 11, None), LaneStep::Nothing),
            (logged(Some(&kept_for), 7, Some(2)), LaneStep::Patch),
            (logged(Some(&kept_for), 7, Some(MOST_KEYS_PER_PATCH)), LaneStep::Patch),
            (logged(Some(&kept_for), 7, Some(0)), LaneStep::Advance),
            (logged(Some(&kept_for), 7, None), LaneStep::Drop(DropWhy::NotKnown)),
            (logged(Some(&kept_for), 7, Some(MOST_KEYS_PER_PATCH + 1)), LaneStep::Drop(DropWhy::TooMany)),
            (logged(None, 7, Some(2)), LaneStep::Drop(DropWhy::Gone)),
            (logged(Some(&next_generation), 7, Some(2)), LaneStep::Drop(DropWhy::NewSpec)),
            (logged(Some(&made_again), 7, Some(0)), LaneStep::Drop(DropWhy::NewSpec)),
        ];
        for (logged, expected) in rows {
            assert_eq!(lane_step(logged), *expected, "{logged:?}");
        }
    }
}
