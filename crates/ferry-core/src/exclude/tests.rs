use super::*;

fn ex(rules: &[Rule]) -> Excludes {
    Excludes::from_rules(rules).unwrap()
}

#[test]
fn exclude_only_as_before() {
    let e = Excludes::new(&["*.tmp".into(), "/build/".into(), "cache".into()]).unwrap();
    assert!(e.excluded(Path::new("a/b.tmp"), false));
    assert!(e.excluded(Path::new("build"), true));
    assert!(!e.excluded(Path::new("x/build"), true));
    assert!(e.excluded(Path::new("x/cache/y"), false));
    assert!(!e.excluded(Path::new("keep.txt"), false));
    assert!(!Excludes::new(&[]).unwrap().excluded(Path::new("a"), false));
}

#[test]
fn first_matching_rule_wins_as_in_rsync() {
    // rsync -f'+ *.txt' -f'- *': only .txt files (and no directories).
    let e = ex(&[Rule::include("*.txt"), Rule::exclude("*")]);
    assert!(!e.excluded(Path::new("a.txt"), false));
    assert!(e.excluded(Path::new("a.log"), false));
    assert!(e.excluded(Path::new("dir"), true));
    // The other order: everything is excluded.
    let e = ex(&[Rule::exclude("*"), Rule::include("*.txt")]);
    assert!(e.excluded(Path::new("a.txt"), false));
    // The classic: keep one tree, drop the rest.
    let e = ex(&[
        Rule::include("/src/"),
        Rule::include("/src/**"),
        Rule::exclude("*"),
    ]);
    assert!(!e.excluded(Path::new("src"), true));
    assert!(!e.excluded(Path::new("src/a/b.rs"), false));
    assert!(e.excluded(Path::new("doc"), true));
}

#[test]
fn rsync_pattern_forms() {
    // An inner `/` matches the end of the path, not only at the root.
    let e = ex(&[Rule::exclude("foo/bar")]);
    assert!(e.excluded(Path::new("foo/bar"), false));
    assert!(e.excluded(Path::new("x/foo/bar"), false));
    assert!(!e.excluded(Path::new("foo/barx"), false));
    // Anchored.
    let e = ex(&[Rule::exclude("/foo/bar")]);
    assert!(!e.excluded(Path::new("x/foo/bar"), false));
    // A trailing `/` matches directories only.
    let e = ex(&[Rule::exclude("logs/")]);
    assert!(e.excluded(Path::new("a/logs"), true));
    assert!(!e.excluded(Path::new("a/logs"), false));
    // `dir/***`: the directory and all in it.
    let e = ex(&[Rule::include("keep/***"), Rule::exclude("*")]);
    assert!(!e.excluded(Path::new("keep"), true));
    assert!(!e.excluded(Path::new("keep/a/b"), false));
    assert!(e.excluded(Path::new("other"), false));
    // `*` stays within a name, `**` crosses.
    let e = ex(&[Rule::exclude("/a/*.o")]);
    assert!(e.excluded(Path::new("a/x.o"), false));
    assert!(!e.excluded(Path::new("a/b/x.o"), false));
    let e = ex(&[Rule::exclude("/a/**.o")]);
    assert!(e.excluded(Path::new("a/b/x.o"), false));
    // `#` and `!` at the start are literal.
    let e = ex(&[Rule::exclude("#x"), Rule::exclude("!y")]);
    assert!(e.excluded(Path::new("#x"), false));
    assert!(e.excluded(Path::new("!y"), false));
    // Trailing spaces count.
    let e = ex(&[Rule::exclude("a ")]);
    assert!(e.excluded(Path::new("a "), false));
    assert!(!e.excluded(Path::new("a"), false));
}

#[test]
fn filter_lines() {
    use FilterLine::*;
    assert_eq!(
        parse_filter("- *.o").unwrap(),
        Rule(super::Rule::exclude("*.o"))
    );
    assert_eq!(
        parse_filter("+ a b").unwrap(),
        Rule(super::Rule::include("a b"))
    );
    assert_eq!(
        parse_filter("-_x").unwrap(),
        Rule(super::Rule::exclude("x"))
    );
    assert_eq!(
        parse_filter("exclude x/").unwrap(),
        Rule(super::Rule::exclude("x/"))
    );
    assert_eq!(
        parse_filter("include x").unwrap(),
        Rule(super::Rule::include("x"))
    );
    assert_eq!(parse_filter(". f.rules").unwrap(), Merge("f.rules".into()));
    assert_eq!(parse_filter("merge f").unwrap(), Merge("f".into()));
    assert_eq!(parse_filter("!").unwrap(), Clear);
    assert_eq!(parse_filter("# c").unwrap(), Nothing);
    assert_eq!(parse_filter("; c").unwrap(), Nothing);
    assert_eq!(parse_filter("   ").unwrap(), Nothing);
    for bad in [
        "P x",
        "protect x",
        ": .rsync-filter",
        "dir-merge .f",
        "-,s x",
        "- ",
        "x y",
        "hide z",
    ] {
        let e = parse_filter(bad).unwrap_err().to_string();
        assert!(e.contains("--filter"), "{bad}: {e}");
    }
    assert_eq!(super::Rule::include("a").to_filter(), "+ a");
    assert_eq!(super::Rule::exclude("b c").to_filter(), "- b c");
}

#[test]
fn double_star_inside_a_name_crosses_directories() {
    assert_eq!(unbounded_double_star("a/**/b"), None);
    assert_eq!(unbounded_double_star("**/b"), None);
    assert_eq!(unbounded_double_star("a/**"), None);
    assert_eq!(unbounded_double_star("a/**.o"), Some(2));
    assert_eq!(unbounded_double_star("x**"), Some(1));
    let e = ex(&[Rule::exclude("/a/**.o")]);
    assert!(e.excluded(Path::new("a/x.o"), false));
    assert!(e.excluded(Path::new("a/b/c/x.o"), false));
    assert!(!e.excluded(Path::new("b/x.o"), false));
    let e = ex(&[Rule::exclude("/src**")]);
    assert!(e.excluded(Path::new("srcx/y"), false));
    assert!(e.excluded(Path::new("src"), true));
}

/// Found by review, each checked against rsync 3.5.
#[test]
fn braces_backslashes_and_inner_double_stars_as_rsync_has_them() {
    // Braces are literal.
    let e = ex(&[Rule::exclude("*.{o,a}")]);
    assert!(e.excluded(Path::new("x.{o,a}"), false));
    assert!(!e.excluded(Path::new("a.o"), false));
    assert!(Excludes::from_rules(&[Rule::exclude("{{x}}")]).is_ok());
    assert!(Excludes::from_rules(&[Rule::exclude("a}")]).is_ok());
    // A backslash without wildcards is a plain character.
    let e = ex(&[Rule::exclude("foo\\bar"), Rule::exclude("dir\\")]);
    assert!(e.excluded(Path::new("foo\\bar"), false));
    assert!(!e.excluded(Path::new("foobar"), false));
    assert!(e.excluded(Path::new("dir\\"), false));
    // With wildcards it escapes: `a\**` is a name starting with `a*`.
    let e = ex(&[Rule::exclude("a\\**")]);
    assert!(e.excluded(Path::new("a*x"), false));
    assert!(!e.excluded(Path::new("ab"), false));
    // `/**/` stands for at least one directory.
    let e = ex(&[Rule::exclude("/**/foo")]);
    assert!(!e.excluded(Path::new("foo"), false));
    assert!(e.excluded(Path::new("a/foo"), false));
    assert!(e.excluded(Path::new("a/b/foo"), false));
    let e = ex(&[Rule::exclude("a/**/b")]);
    assert!(!e.excluded(Path::new("a/b"), false));
    assert!(!e.excluded(Path::new("c/a/b"), false));
    assert!(e.excluded(Path::new("a/x/b"), false));
    assert!(e.excluded(Path::new("c/a/x/y/b"), false));
    // A leading unanchored `**/` matches at the top too.
    let e = ex(&[Rule::exclude("**/foo")]);
    assert!(e.excluded(Path::new("x/foo"), false));
}

#[test]
fn a_directory_only_pattern_never_matches_the_root_itself() {
    for pat in ["*/", "/*/", "**/", "*"] {
        let e = ex(&[Rule::exclude(pat)]);
        assert!(e.excluded(Path::new("d"), true), "{pat}");
        assert!(e.excluded(Path::new("d/g"), false), "{pat}: inside d");
        let file = e.excluded(Path::new("file"), false);
        assert_eq!(file, pat == "*", "{pat}: a top-level file");
    }
    let e = ex(&[Rule::include("keep/"), Rule::exclude("*/")]);
    assert!(!e.excluded(Path::new("keep"), true));
    assert!(!e.excluded(Path::new("keep/x"), false));
    assert!(!e.excluded(Path::new("top.txt"), false));
    assert!(e.excluded(Path::new("other/x"), false));
}
