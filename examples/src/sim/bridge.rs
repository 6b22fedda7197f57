//! The product's estimator, in the simulator's process: the provider crate's `Estimator`
//! (`tokenwarden_provider::estimate`, the very code every engine package runs for the
//! driver's `DefaultEstimator`) with o200k_base as its tokenizer, its clock the simulator's
//! virtual time, called the way the `fetch` wrapper calls it: each attempt of a call
//! estimates the same body, the settled call's usage is observed with that attempt's
//! estimate, a call given up is forgotten.

use std::collections::BTreeMap;
use std::sync::Arc;

use tokenwarden_core::Usage;
use tokenwarden_provider::bpe::{self, Bpe, Encoding};
use tokenwarden_provider::estimate::{Estimator, Options, Provider, call_shape, prompt_tokens};

/// The estimator's figures for one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BridgeEstimate {
    /// `inputTokens`.
    pub input_tokens: u64,
    /// `cachedPrefixTokens`.
    pub cached_prefix_tokens: u64,
    /// `cachedPrefixConfirmed`: the estimator saw the provider cache that prefix.
    pub cached_prefix_confirmed: bool,
    /// `max_tokens` as the provider crate's `call_shape` reads it from the body.
    pub max_tokens: u64,
}

/// A call being made: its body, model, and the id of its latest estimate.
struct Pending {
    body: serde_json::Value,
    model: String,
    estimate: Option<u64>,
}

/// The product's estimator for one run.
pub struct EstimatorBridge {
    estimator: Estimator,
    calls: BTreeMap<u64, Pending>,
    /// Which estimator answers.
    pub describe: String,
}

impl Default for EstimatorBridge {
    fn default() -> EstimatorBridge {
        EstimatorBridge::new()
    }
}

impl EstimatorBridge {
    /// The default estimator, as `DefaultEstimator` makes it, counting with o200k_base.
    pub fn new() -> EstimatorBridge {
        let mut estimator =
            Estimator::new(Options::default()).expect("the default options are valid");
        let o200k =
            Bpe::new(Encoding::O200kBase, bpe::O200K_BASE).expect("the embedded ranks load");
        estimator.use_tokenizer(Arc::new(o200k));
        EstimatorBridge {
            estimator,
            calls: BTreeMap::new(),
            describe: "DefaultEstimator (tokenwarden-provider's Estimator, o200k_base)".into(),
        }
    }

    /// Estimates call `call` at virtual time `now`: the first time with its body (Anthropic
    /// Messages JSON), later attempts of the same call without (the same body again, as the
    /// `fetch` wrapper estimates it on each ask).
    ///
    /// # Panics
    ///
    /// A body that is not a JSON object, or a later attempt of a call never given one: the
    /// simulator's own mistakes.
    pub fn estimate(&mut self, call: u64, now: u64, body: Option<&str>) -> BridgeEstimate {
        if let Some(text) = body {
            let body: serde_json::Value =
                serde_json::from_str(text).expect("the simulator's bodies are JSON");
            let model = body
                .get("model")
                .and_then(|m| m.as_str())
                .unwrap_or("")
                .to_string();
            self.calls.insert(
                call,
                Pending {
                    body,
                    model,
                    estimate: None,
                },
            );
        }
        let c = self
            .calls
            .get_mut(&call)
            .unwrap_or_else(|| panic!("estimate of call {call}: no body sent for it"));
        let shape = call_shape(Provider::Anthropic, &c.body);
        let (id, e) = self
            .estimator
            .estimate(now, Provider::Anthropic, &c.model, &c.body);
        if let Some(old) = c.estimate.replace(id) {
            self.estimator.forget(old);
        }
        BridgeEstimate {
            input_tokens: e.input_tokens,
            cached_prefix_tokens: e.cached_prefix_tokens,
            cached_prefix_confirmed: e.cached_prefix_confirmed,
            max_tokens: shape.max_tokens,
        }
    }

    /// The provider's usage for call `call` arrived at `now`: the estimator observes it with
    /// every prompt token the usage counts (and the call is forgotten).
    ///
    /// # Panics
    ///
    /// A call never estimated.
    pub fn observe(&mut self, call: u64, now: u64, u: &Usage) {
        let c = self
            .calls
            .remove(&call)
            .unwrap_or_else(|| panic!("observe of call {call}: never estimated"));
        let id = c
            .estimate
            .unwrap_or_else(|| panic!("observe of call {call}: never estimated"));
        let usage = tokenwarden_provider::Usage {
            input_tokens: u.input_tokens,
            cache_creation_input_tokens: u.cache_creation_input_tokens,
            cache_read_input_tokens: u.cache_read_input_tokens,
            output_tokens: u.output_tokens,
        };
        self.estimator.observe(
            id,
            now,
            Provider::Anthropic,
            &c.model,
            Some(&c.body),
            prompt_tokens(&usage),
            Some(&usage),
        );
    }

    /// Call `call` ended without usage (the turn was given up): the estimator never hears of it.
    pub fn forget(&mut self, call: u64) {
        if let Some(Pending {
            estimate: Some(id), ..
        }) = self.calls.remove(&call)
        {
            self.estimator.forget(id);
        }
    }
}
