//! `/debug`: one server-rendered HTML page a person can read in a browser. No scripts, no
//! build step: connected proxies and their sync state, resource counts, a chart of recent
//! push latencies, and links to every JSON view and the explain form.

use std::fmt::Write;

use axum::extract::State;
use axum::response::Html;

use crate::debug::DebugState;
use crate::discovery::names::TypeKind;

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// An SVG bar chart of latencies in milliseconds.
fn chart(latencies: &[f64]) -> String {
    if latencies.is_empty() {
        return "<p class=muted>No pushes yet.</p>".to_string();
    }
    let (width, height) = (480.0, 80.0);
    let max = latencies.iter().copied().fold(0.0_f64, f64::max).max(1e-6);
    let bar = width / latencies.len() as f64;
    let mut svg = format!(
        "<svg role=img aria-label=\"recent push latencies\" width={width} height={height} viewBox=\"0 0 {width} {height}\">"
    );
    for (i, seconds) in latencies.iter().enumerate() {
        let h = (seconds / max * (height - 2.0)).max(1.0);
        let _ = write!(
            svg,
            "<rect x={:.1} y={:.1} width={:.1} height={:.1} fill=\"#3b82f6\"><title>{:.3} ms</title></rect>",
            i as f64 * bar,
            height - h,
            (bar - 1.0).max(1.0),
            h,
            seconds * 1000.0
        );
    }
    svg.push_str("</svg>");
    let mut sorted = latencies.to_vec();
    sorted.sort_by(|a, b| a.total_cmp(b));
    let median = sorted[sorted.len() / 2] * 1000.0;
    let worst = sorted[sorted.len() - 1] * 1000.0;
    format!(
        "{svg}<p class=muted>last {} pushes: median {median:.3} ms, max {worst:.3} ms</p>",
        sorted.len()
    )
}

pub async fn page(State(state): State<DebugState>) -> Html<String> {
    let snapshot = state.snapshots.borrow().clone();
    let connections = state.registry.list();
    let mut html = String::from(
        "<!doctype html><html><head><meta charset=utf-8><title>ambientd debug</title><style>\
         body{font-family:system-ui,sans-serif;margin:2em;color:#111}\
         table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:4px 8px;text-align:left}\
         th{background:#f3f4f6}.muted{color:#666}.ok{color:#15803d}.bad{color:#b91c1c}\
         code{background:#f3f4f6;padding:1px 3px}</style></head><body>",
    );
    let _ = write!(
        html,
        "<h1>ambientd</h1><p class=muted>version {} &middot; up {}s &middot; snapshot generation {}</p>",
        env!("CARGO_PKG_VERSION"),
        state.metrics.uptime().as_secs(),
        snapshot.as_ref().map_or(0, |s| s.generation)
    );
    match &snapshot {
        Some(s) => {
            let services = s.addresses.values().filter(|r| r.is_service()).count();
            let _ = write!(
                html,
                "<h2>Mesh</h2><table><tr><th>workloads</th><th>services</th><th>policies</th></tr>\
                 <tr><td>{}</td><td>{}</td><td>{}</td></tr></table>",
                s.addresses.len() - services,
                services,
                s.authorizations.len()
            );
        }
        None => html.push_str("<p class=bad>Not ready: waiting for the first full load.</p>"),
    }
    let _ = write!(html, "<h2>Connected proxies ({})</h2>", connections.len());
    if connections.is_empty() {
        html.push_str("<p class=muted>None.</p>");
    } else {
        html.push_str(
            "<table><tr><th>proxy</th><th>node</th><th>address</th><th>type</th>\
             <th>sent</th><th>acked</th><th>state</th></tr>",
        );
        for c in &connections {
            let proxy = c.proxy.clone().unwrap_or_default();
            for kind in TypeKind::ALL {
                let Some(t) = c.types.get(&kind) else {
                    continue;
                };
                let state = match (&t.last_error, t.sent_nonce == t.acked_nonce) {
                    (Some(error), _) => format!("<span class=bad>NACK: {}</span>", escape(error)),
                    (None, true) => "<span class=ok>synced</span>".to_string(),
                    (None, false) => "<span class=muted>pending ACK</span>".to_string(),
                };
                let _ = write!(
                    html,
                    "<tr><td><a href=\"/debug/config_dump?proxyID={id}\">{proxy}</a></td><td>{node}</td>\
                     <td>{peer}</td><td>{kind}</td><td><code>{sent}</code></td><td><code>{acked}</code></td><td>{state}</td></tr>",
                    id = escape(&c.connection_id),
                    proxy = escape(if proxy.id.is_empty() {
                        &c.connection_id
                    } else {
                        &proxy.id
                    }),
                    node = escape(&proxy.node_name),
                    peer = escape(&c.peer),
                    kind = crate::debug::views::type_name(kind),
                    sent = escape(&t.sent_nonce),
                    acked = escape(&t.acked_nonce),
                );
            }
        }
        html.push_str("</table>");
    }
    html.push_str("<h2>Recent push latencies</h2>");
    html.push_str(&chart(&state.metrics.recent_pushes()));
    html.push_str(
        "<h2>Explain a connection</h2>\
         <form action=/debug/authorize method=get>\
         source <input name=source placeholder=\"spiffe://cluster.local/ns/a/sa/b, an IP, or plaintext\" size=40> \
         destination <input name=destination placeholder=\"uid, IP or ns/name\" size=28> \
         port <input name=port size=6 placeholder=8080> <button>explain</button></form>\
         <h2>Views</h2><ul>\
         <li><a href=/debug/syncz>/debug/syncz</a>: sync state per connection</li>\
         <li><a href=/debug/connections>/debug/connections</a> and <a href=/debug/adsz>/debug/adsz</a></li>\
         <li><a href=/debug/ambientz>/debug/ambientz</a>: workloads, services and policies</li>\
         <li><code>/debug/config_dump?proxyID=</code>: what one proxy was sent</li>\
         <li><a href=/metrics>/metrics</a>, <a href=/ready>/ready</a>, <a href=/version>/version</a></li>\
         <li><code>/logging?level=debug</code>: change the log filter</li>\
         </ul></body></html>",
    );
    Html(html)
}
