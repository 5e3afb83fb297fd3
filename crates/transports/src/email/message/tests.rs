use super::*;

fn raw(headers: &str, body: &str) -> Vec<u8> {
    format!("{headers}\r\n\r\n{body}").into_bytes()
}

fn check_strip(input: &str, expected: &str) {
    assert_eq!(strip_reply(input), expected, "input: {input:?}");
}

#[test]
fn quoted_replies_and_signatures_are_stripped() {
    check_strip("Fix it please.\n\n-- \nAlice\nCEO", "Fix it please.");
    check_strip(
        "Yes, go ahead.\n\nOn Tue, 1 Dec 2026 at 10:00, Agent <a@b.c> wrote:\n> old\n> older",
        "Yes, go ahead.",
    );
    // An attribution wrapped over two lines.
    check_strip(
        "Sure.\n\nOn Tue, 1 Dec 2026 at 10:00 Lemon Agent\n<agent@lemon.test> wrote:\n\n> old",
        "Sure.",
    );
    check_strip("Top.\n\n-----Original Message-----\nFrom: x\nold", "Top.");
    check_strip("Interleaved\n> quoted\nanswer", "Interleaved\nanswer");
    check_strip("On it.\n\nSent from my iPhone", "On it.");
    // "On … wrote:" in the text itself, not followed by a quote, stays.
    check_strip("On Monday I wrote: the plan\nand more", "On Monday I wrote: the plan\nand more");
    check_strip("line\r\nother", "line\nother");
}

#[test]
fn a_mail_is_read_with_its_thread_headers() {
    let mail = parse(&raw(
        "From: \"Alice A.\" <Alice@Example.com>\r\nTo: agent@lemon.test\r\nSubject: Re: Build\r\n\
         Message-ID: <m3@example.com>\r\nIn-Reply-To: <m2@lemon.test>\r\n\
         References: <m1@example.com>\r\n <m2@lemon.test>",
        "ok\r\n\r\n> quoted\r\n",
    ))
    .expect("parses");
    assert_eq!(mail.message_id, "m3@example.com");
    assert_eq!(mail.in_reply_to, ["m2@lemon.test"]);
    assert_eq!(mail.references, ["m1@example.com", "m2@lemon.test"]);
    assert_eq!(mail.from.as_deref(), Some("alice@example.com"));
    assert_eq!(mail.subject, "Re: Build");
    assert_eq!(mail.text, "ok");
    assert!(!mail.automatic);
    assert_eq!(ancestors(&mail), ["m2@lemon.test", "m1@example.com"]);
    assert_eq!(thread_root(&mail), "m1@example.com");
}

#[test]
fn a_mail_without_a_message_id_gets_one_from_its_content() {
    let one = parse(&raw("From: a@b.cd\r\nSubject: x", "hello")).unwrap();
    let again = parse(&raw("From: a@b.cd\r\nSubject: x", "hello")).unwrap();
    assert_eq!(one.message_id, again.message_id);
    assert!(one.message_id.ends_with("@content.invalid"));
    assert_eq!(thread_root(&one), one.message_id);
    assert_eq!(run_id(&one), run_id(&again));
}

#[test]
fn several_from_addresses_are_no_sender() {
    let mail = parse(&raw("From: a@b.cd, c@d.ef\r\nMessage-ID: <x@y.z>", "hi")).unwrap();
    assert_eq!(mail.from, None);
}

#[test]
fn automatic_mail_is_recognised() {
    let auto = parse(&raw("From: a@b.cd\r\nAuto-Submitted: auto-replied", "away")).unwrap();
    assert!(auto.automatic);
    let no = parse(&raw("From: a@b.cd\r\nAuto-Submitted: no", "hi")).unwrap();
    assert!(!no.automatic);
    let bulk = parse(&raw("From: a@b.cd\r\nPrecedence: bulk", "news")).unwrap();
    assert!(bulk.automatic);
}

#[test]
fn attachments_are_read_and_their_names_made_safe() {
    let body = "--b1\r\nContent-Type: text/plain\r\n\r\nsee attached\r\n--b1\r\n\
                Content-Type: text/plain; name=\"../../etc/passwd\"\r\n\
                Content-Disposition: attachment; filename=\"../../etc/passwd\"\r\n\
                Content-Transfer-Encoding: base64\r\n\r\naGVsbG8=\r\n--b1--\r\n";
    let mail = parse(&raw(
        "From: a@b.cd\r\nMessage-ID: <att@b.cd>\r\nMIME-Version: 1.0\r\n\
         Content-Type: multipart/mixed; boundary=\"b1\"",
        body,
    ))
    .unwrap();
    assert_eq!(mail.text, "see attached");
    assert_eq!(mail.attachments.len(), 1);
    assert_eq!(mail.attachments[0].filename, "passwd");
    assert_eq!(mail.attachments[0].content, b"hello");
    assert_eq!(mail.attachments[0].mime, "text/plain");
    // Kept files are named by the run's note; only the others are listed.
    assert_eq!(prompt(&mail, &[]), "see attached");
    let not_kept = [(0, "files are not accepted here".to_owned())];
    assert_eq!(
        prompt(&mail, &not_kept),
        "see attached\n\nAttachments not saved:\n- passwd (text/plain, 5 bytes): files are not accepted here"
    );
    assert_eq!(safe_filename(".hidden"), "hidden");
    assert_eq!(safe_filename("a\\b\\c d.txt"), "c d.txt");
    assert_eq!(safe_filename("x;rm -rf.txt"), "x_rm -rf.txt");
}

#[test]
fn an_inline_image_without_a_name_is_named_by_its_type_and_files_alone_get_a_prompt() {
    let body = "--r1\r\nContent-Type: text/html\r\n\r\n<p><img src=\"cid:logo\"></p>\r\n--r1\r\n\
                Content-Type: image/png\r\nContent-ID: <logo>\r\nContent-Disposition: inline\r\n\
                Content-Transfer-Encoding: base64\r\n\r\niVBORw0KGgo=\r\n--r1--\r\n";
    let mail = parse(&raw(
        "From: a@b.cd\r\nMessage-ID: <img@b.cd>\r\nMIME-Version: 1.0\r\n\
         Content-Type: multipart/related; boundary=\"r1\"",
        body,
    ))
    .unwrap();
    assert_eq!(mail.attachments.len(), 1, "{mail:?}");
    assert_eq!(mail.attachments[0].filename, "image-1.png");
    assert_eq!(mail.attachments[0].mime, "image/png");
    assert_eq!(mail.attachments[0].content, b"\x89PNG\r\n\x1a\n");
    let mut bare = mail.clone();
    bare.text.clear();
    bare.subject.clear();
    assert_eq!(prompt(&bare, &[]), "(files attached)");
}

#[test]
fn authentication_results_decide_whether_a_sender_is_believed() {
    let results = |text: &str| vec![parse_auth_results(text).unwrap()];
    let mx = Some("mx.example.com");
    let alice = "alice@example.com";
    let pass = results("mx.example.com; dkim=pass header.d=example.com; spf=pass");
    assert_eq!(check_sender(&pass, alice, mx, true), SenderCheck::Trusted);
    let dmarc = results("mx.example.com;\r\n dmarc=fail (p=reject) header.from=example.com");
    assert_eq!(check_sender(&dmarc, alice, mx, false), SenderCheck::Forged);
    let spf_only = results("mx.example.com; spf=fail; dkim=none");
    assert_eq!(check_sender(&spf_only, alice, mx, false), SenderCheck::Forged);
    let spf_but_dkim = results("mx.example.com; spf=softfail; dkim=pass header.d=example.com");
    assert_eq!(check_sender(&spf_but_dkim, alice, mx, false), SenderCheck::Trusted);
    assert_eq!(check_sender(&[], alice, mx, false), SenderCheck::Trusted);
    assert_eq!(check_sender(&[], alice, mx, true), SenderCheck::Unauthenticated);
    // Results of another server are not believed, either way.
    assert_eq!(check_sender(&dmarc, alice, Some("mx.google.com"), false), SenderCheck::Trusted);
    assert_eq!(
        check_sender(&pass, alice, Some("mx.google.com"), true),
        SenderCheck::Unauthenticated
    );
    assert_eq!(check_sender(&pass, alice, Some("MX.example.com"), true), SenderCheck::Trusted);
    // Without an authserv_id no header is believed: anyone can write one.
    assert_eq!(check_sender(&pass, alice, None, true), SenderCheck::Unauthenticated);
    assert_eq!(check_sender(&dmarc, alice, None, false), SenderCheck::Trusted);
}

#[test]
fn a_pass_counts_only_for_a_domain_aligned_with_the_from() {
    let results = |text: &str| vec![parse_auth_results(text).unwrap()];
    let mx = Some("mx.example.com");
    let alice = "alice@example.com";
    for unaligned in [
        "mx.example.com; dkim=pass header.d=evil.test",
        "mx.example.com; spf=pass smtp.mailfrom=bounce@evil.test",
        "mx.example.com; dmarc=pass header.from=evil.test",
        "mx.example.com; dkim=pass header.d=example.com.evil.test",
        "mx.example.com; dkim=pass header.d=com",
        // A pass that names no domain cannot be aligned.
        "mx.example.com; dkim=pass; spf=pass",
    ] {
        assert_eq!(
            check_sender(&results(unaligned), alice, mx, true),
            SenderCheck::Unauthenticated,
            "{unaligned}"
        );
    }
    for aligned in [
        "mx.example.com; dkim=pass header.d=example.com",
        "mx.example.com; dkim=pass header.i=@example.com header.d=Mail.Example.COM",
        "mx.example.com; spf=pass smtp.mailfrom=\"bounces@example.com\"",
        "mx.example.com; spf=pass smtp.mailfrom=example.com",
        "mx.example.com 1; dmarc=pass (p=none dis=none) header.from=example.com",
    ] {
        assert_eq!(
            check_sender(&results(aligned), alice, mx, true),
            SenderCheck::Trusted,
            "{aligned}"
        );
    }
    // The From's domain may be the subdomain.
    let parent = results("mx.example.com; dkim=pass header.d=example.com");
    assert_eq!(check_sender(&parent, "bob@eu.example.com", mx, true), SenderCheck::Trusted);
    // An unaligned pass does not excuse a failure either.
    let spf_fail =
        results("mx.example.com; spf=fail smtp.mailfrom=example.com; dkim=pass header.d=evil.test");
    assert_eq!(check_sender(&spf_fail, alice, mx, false), SenderCheck::Forged);
}

#[test]
fn alignment_is_equal_or_a_subdomain() {
    assert!(aligned("example.com", "example.com"));
    assert!(aligned("Mail.example.com", "example.com"));
    assert!(aligned("example.com", "a.b.example.com"));
    assert!(!aligned("badexample.com", "example.com"));
    assert!(!aligned("example.com.evil.test", "example.com"));
    assert!(!aligned("com", "example.com"));
    assert!(!aligned("", "example.com"));
}

#[test]
fn results_are_read_with_their_domains_and_without_comments() {
    let parsed = parse_auth_results(
        "mx.example.com (Postfix; x=y);\r\n\tdkim=pass (2048-bit key; unprotected) header.d=Example.com header.s=sel;\r\n\tspf=pass (sender ok) smtp.mailfrom=b@Bounce.example.com; dmarc=fail header.from=example.com.",
    )
    .unwrap();
    assert_eq!(parsed.authserv_id, "mx.example.com");
    let triples: Vec<(&str, &str, Option<&str>)> = parsed
        .results
        .iter()
        .map(|r| (r.method.as_str(), r.result.as_str(), r.domain.as_deref()))
        .collect();
    assert_eq!(
        triples,
        [
            ("dkim", "pass", Some("example.com")),
            ("spf", "pass", Some("bounce.example.com")),
            ("dmarc", "fail", Some("example.com")),
        ]
    );
    assert_eq!(parse_auth_results("  ; dkim=pass"), None);
}

#[test]
fn two_from_headers_are_no_sender() {
    let two = parse(&raw(
        "From: alice@example.com\r\nFrom: mallory@evil.test\r\nMessage-ID: <x@y.z>",
        "hi",
    ))
    .unwrap();
    assert_eq!(two.from, None);
    let one = parse(&raw("From: Alice <alice@example.com>\r\nMessage-ID: <x@y.z>", "hi")).unwrap();
    assert_eq!(one.from.as_deref(), Some("alice@example.com"));
}

#[test]
fn session_keys_have_one_shape_and_name_their_thread_back() {
    let thread = thread_id("m1@example.com");
    assert_eq!(thread.len(), 20);
    let key = session_key("main", &thread).unwrap();
    assert_eq!(key.as_str(), format!("agent:main:email:{thread}"));
    assert_eq!(thread_of(key.as_str()), Some(thread.as_str()));
    assert_eq!(session_key("ma in", &thread), None);
    assert_eq!(session_key("main", "a\nb"), None);
    assert_eq!(thread_of("agent:main:email:xyz"), None);
    assert_eq!(thread_of("agent:main:telegram:1:dm:2"), None);
}

#[test]
fn reply_subjects_do_not_pile_up() {
    assert_eq!(reply_subject("Build"), "Re: Build");
    assert_eq!(reply_subject("RE: Build"), "RE: Build");
    assert_eq!(reply_subject("  "), "Re: your message");
}
