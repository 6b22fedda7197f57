//! The live dashboard of one quota: the page the edge Worker serves (written once, in
//! edge/src/dashboard.js; serve/assets/ holds it with placeholders, made by
//! edge/scripts/dashboard-asset.mjs and checked by the edge suite), under its hash-based
//! Content Security Policy. The page carries no data: it asks for the fleet's secret and
//! then polls the metrics and timeline endpoints with it.

const PAGE: &str = include_str!("../assets/dashboard.html");
/// The page's `Content-Security-Policy`.
pub(crate) const CSP: &str = include_str!("../assets/dashboard.csp");

/// Text made safe for HTML element content and quoted attribute values (as the page's
/// `escapeHtml`: `&`, `<`, `>`, `"` and `'` as numeric references).
fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' | '<' | '>' | '"' | '\'' => out.push_str(&format!("&#{};", u32::from(c))),
            c => out.push(c),
        }
    }
    out
}

/// The page for quota `quota` of fleet `fleet`, its endpoints under `base`
/// (`/v1/fleets/<fleet>/quotas/<quota>`).
pub(crate) fn page(fleet: &str, quota: &str, base: &str) -> String {
    PAGE.replace("{{fleet}}", &escape(fleet))
        .replace("{{quota}}", &escape(quota))
        .replace("{{metricsPath}}", &escape(&format!("{base}/metrics")))
        .replace("{{timelinePath}}", &escape(&format!("{base}/timeline")))
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_page_names_its_quota_escaped_and_no_placeholder_is_left() {
        let p = super::page("acme", "a<b", "/v1/fleets/acme/quotas/a<b");
        assert!(p.contains("data-quota=\"a&#60;b\""));
        assert!(p.contains("data-metrics-path=\"/v1/fleets/acme/quotas/a&#60;b/metrics\""));
        assert!(!p.contains("{{fleet}}") && !p.contains("{{timelinePath}}"));
        assert!(super::CSP.starts_with("default-src 'none'; script-src 'sha256-"));
        assert!(
            http::HeaderValue::from_str(super::CSP).is_ok(),
            "a header value"
        );
    }
}
