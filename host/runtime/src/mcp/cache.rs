//! The caches of one connection's resource, resource template and prompt listings, as the
//! server's cache hints (SEP-2549) allow: a listing is kept only when its pages carry a
//! `ttlMs` (the shortest of them, at most the host's tools TTL; `0` keeps nothing), and a
//! `cacheScope: private` listing is served only to the principal it was read for. A
//! listing is kept whole, in the server's order. Unlike tools, a listing without hints is
//! not kept: these lists change more often and are read rarely. The server's
//! `list_changed` notifications drop them (`resources/list_changed` drops the templates
//! too), and so does a new connection: the caches live on the connection.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rmcp::model::{Prompt, Resource, ResourceTemplate};

/// The listings of one connection.
#[derive(Default)]
pub(crate) struct ListCaches {
    pub(crate) resources: ListCache<Resource>,
    pub(crate) templates: ListCache<ResourceTemplate>,
    pub(crate) prompts: ListCache<Prompt>,
}

impl ListCaches {
    /// `notifications/resources/list_changed`.
    pub(crate) fn resources_changed(&self) {
        self.resources.clear();
        self.templates.clear();
    }

    /// `notifications/prompts/list_changed`.
    pub(crate) fn prompts_changed(&self) {
        self.prompts.clear();
    }
}

/// One kind of listing, kept while fresh.
pub(crate) struct ListCache<T> {
    state: Mutex<State<T>>,
}

impl<T> Default for ListCache<T> {
    fn default() -> Self {
        Self {
            state: Mutex::new(State {
                generation: 0,
                kept: None,
            }),
        }
    }
}

struct State<T> {
    /// Bumped by every [`ListCache::clear`], so a listing read across a change is not kept.
    generation: u64,
    kept: Option<Kept<T>>,
}

struct Kept<T> {
    fetched: Instant,
    ttl: Duration,
    /// `Some(principal)`: a private listing, served to that principal only.
    private_to: Option<Option<Arc<str>>>,
    items: Arc<[T]>,
}

/// A listing the cache could not serve: when it was asked, to keep the fresh one with.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Miss(u64);

impl<T: Clone> ListCache<T> {
    /// The kept listing if it is fresh and may be served to `principal`.
    pub(crate) fn fresh(&self, principal: Option<&str>) -> Result<Vec<T>, Miss> {
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        match &state.kept {
            Some(kept)
                if kept.fetched.elapsed() < kept.ttl
                    && kept
                        .private_to
                        .as_ref()
                        .is_none_or(|owner| owner.as_deref() == principal) =>
            {
                Ok(kept.items.to_vec())
            }
            _ => Err(Miss(state.generation)),
        }
    }

    /// Keeps `items`, read for `principal` after `miss`, for `ttl` (nothing when zero, or
    /// when the list changed since `miss`).
    pub(crate) fn keep(
        &self,
        miss: Miss,
        ttl: Duration,
        private: bool,
        principal: Option<&str>,
        items: &[T],
    ) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if ttl.is_zero() || state.generation != miss.0 {
            return;
        }
        state.kept = Some(Kept {
            fetched: Instant::now(),
            ttl,
            private_to: private.then(|| principal.map(Arc::from)),
            items: items.into(),
        });
    }

    fn clear(&self) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.generation = state.generation.wrapping_add(1);
        state.kept = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listing_is_kept_for_its_ttl_for_whom_it_may_serve_and_until_it_changes() {
        let cache = ListCache::<u32>::default();
        let miss = cache.fresh(None).unwrap_err();
        cache.keep(miss, Duration::ZERO, false, None, &[1]);
        assert!(cache.fresh(None).is_err(), "ttlMs 0 keeps nothing");
        cache.keep(miss, Duration::from_secs(60), false, None, &[3, 1, 2]);
        assert_eq!(cache.fresh(Some("ada")).unwrap(), [3, 1, 2], "order kept");

        let miss = cache.fresh(None).map(|_| ()).err();
        assert!(miss.is_none());
        cache.clear();
        let miss = cache.fresh(None).unwrap_err();
        cache.clear();
        cache.keep(miss, Duration::from_secs(60), false, None, &[1]);
        assert!(cache.fresh(None).is_err(), "read across a change: not kept");

        let miss = cache.fresh(None).unwrap_err();
        cache.keep(miss, Duration::from_secs(60), true, Some("ada"), &[7]);
        assert_eq!(cache.fresh(Some("ada")).unwrap(), [7]);
        assert!(cache.fresh(Some("bob")).is_err(), "private to ada");
        assert!(cache.fresh(None).is_err());

        let miss = cache.fresh(None).unwrap_err();
        cache.keep(miss, Duration::from_millis(1), false, None, &[1]);
        std::thread::sleep(Duration::from_millis(5));
        assert!(cache.fresh(None).is_err(), "expired");
    }
}
