//! A person's queue on the real stores: holds whose outcome recovery cannot learn become
//! incidents, and `flashsale incidents` resolves them by a person's decision. The ledger
//! "would not tell" through a failpoint (built with the `failpoints` feature, which
//! scripts/test.sh turns on) scoped to request_ids of this test's own prefix, so the
//! other tests' recovery is untouched.

use std::time::Duration;

use flashsale::incidents::{Action, DecisionArg};
use flashsale_app::maintenance::RECOVERY_TRIES_MAX;
use reqwest::StatusCode;

use crate::helpers::{order_id, TestApp, REQUEST_RELEASED};
use crate::invariants;
use crate::recovery::{abandoned_hold, FAST_RECOVERY};

/// What `flashsale incidents <action>` prints, and its exit code, through its own code.
async fn incidents(app: &TestApp, action: Action) -> (String, std::process::ExitCode) {
    let mut out = Vec::new();
    let code = flashsale::incidents::run(&app.maintenance, action, &mut out)
        .await
        .expect("the command ran");
    (String::from_utf8(out).expect("utf-8"), code)
}

/// The incidents of `request_id`: (id, decision, by, note), newest first.
async fn rows(
    app: &TestApp,
    request_id: &str,
) -> Vec<(i64, Option<String>, Option<String>, Option<String>)> {
    app.rows(
        "SELECT id, CAST(decision AS CHAR), CAST(resolved_by AS CHAR), CAST(note AS CHAR) \
         FROM recovery_incident WHERE request_id = ? ORDER BY id DESC",
        request_id,
    )
    .await
}

// Checks a hold driven into an incident and resolved both ways. How: two abandoned holds
// ("incident-release", "incident-confirm") whose ledger lookups fail (the failpoint), past
// the recovery window, go through RECOVERY_TRIES_MAX recovery passes: each becomes one
// open outcome_unknown incident in recovery_incident, `flashsale_recovery_incidents_total`
// (what FlashsaleRecoveryIncident watches) counts them, and `incidents list` shows them.
// `resolve --decision release` on the first fences it (a retry of its request answers
// 409 request_released) and puts its unit back on sale; `resolve --decision confirm` on
// the second makes its order (a retry answers 200 with it). Both incidents then carry the
// decision, who made it and the note; a second decision on one is refused (exit 1), and
// recovery, the ledger telling again, leaves both alone. The audit is clean.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_outcome_becomes_an_incident_a_person_resolves_both_ways() {
    let app = TestApp::selling_with(FAST_RECOVERY, (2600, 5, None)).await;
    abandoned_hold(&app, "incident-release", 1, 2600).await;
    abandoned_hold(&app, "incident-confirm", 2, 2600).await;
    assert_eq!(app.redis_available(2600).await, Some(3));
    fail::cfg("recovery-lookup", "return(incident-)").expect("failpoint");
    tokio::time::sleep(Duration::from_millis(2_100)).await;
    let mut raised = 0;
    for _ in 0..RECOVERY_TRIES_MAX {
        let report = app.maintenance.recover_once().await.expect("pass");
        assert_eq!(report.released, 0, "nothing guessed: {report:?}");
        raised += report.incidents;
    }
    assert_eq!(raised, 2, "one incident per hold, at the last try");
    let release = rows(&app, "incident-release").await;
    let confirm = rows(&app, "incident-confirm").await;
    assert_eq!(release.len(), 1, "{release:?}");
    assert_eq!(confirm.len(), 1, "{confirm:?}");
    let (text, _) = app.scrape_metrics().await;
    assert!(
        text.lines()
            .any(|l| l == "flashsale_recovery_incidents_total 2"),
        "the alert's series counts them"
    );
    let (listed, _) = incidents(&app, Action::List { all: false }).await;
    assert!(
        listed.contains("incident-release") && listed.contains("incident-confirm"),
        "{listed}"
    );

    let resolve = |id, decision| Action::Resolve {
        id,
        decision,
        note: "checked the payment provider".to_owned(),
        by: Some("ops-on-call".to_owned()),
    };
    let (said, code_of) = incidents(&app, resolve(release[0].0, DecisionArg::Release)).await;
    assert_eq!(code_of, std::process::ExitCode::SUCCESS, "{said}");
    assert_eq!(app.redis_available(2600).await, Some(4), "{said}");
    app.refused(("incident-release", 1, 2600, 1), REQUEST_RELEASED)
        .await;

    let (said, code_of) = incidents(&app, resolve(confirm[0].0, DecisionArg::Confirm)).await;
    assert_eq!(code_of, std::process::ExitCode::SUCCESS, "{said}");
    let (status, body) = app.purchase("incident-confirm", 2, 2600, 1).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(
        said.contains(&format!("order {}", order_id(&body))),
        "{said}"
    );

    for request_id in ["incident-release", "incident-confirm"] {
        let decided = rows(&app, request_id).await;
        let (_, decision, by, note) = &decided[0];
        assert!(decision.is_some(), "{decided:?}");
        assert_eq!(by.as_deref(), Some("ops-on-call"));
        assert_eq!(note.as_deref(), Some("checked the payment provider"));
    }
    let (said, code_of) = incidents(&app, resolve(release[0].0, DecisionArg::Confirm)).await;
    assert_eq!(code_of, std::process::ExitCode::from(1), "{said}");
    assert!(said.contains("decided already"), "{said}");

    fail::remove("recovery-lookup");
    let report = app.maintenance.recover_once().await.expect("pass");
    assert_eq!(report.released + report.orphans_released, 0, "{report:?}");
    assert_eq!(app.redis_available(2600).await, Some(4));
    invariants::assert_audit_clean(&app, 2600).await;
    invariants::assert_ok_and_clean_up(app, 2600).await;
}
