//! A lexer that keeps only what import paths need: identifiers (keywords included), `::`
//! and single punctuation characters, each with its line. Comments (line, block, nested
//! block, doc) vanish; string, byte-string, C-string, raw-string, char and number literals
//! become one [`Tok::Literal`] each, so `"crate::x"` in a string is never a path; a
//! lifetime or label (`'a`, `'outer`) is a [`Tok::Lifetime`], never the start of a char.

/// One token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Tok {
    /// An identifier or keyword; a raw identifier `r#type` is `type`.
    Ident(String),
    /// `::`.
    PathSep,
    /// Any other punctuation character.
    Punct(char),
    /// A string, char or number literal; its text is dropped.
    Literal,
    /// A lifetime or a loop label.
    Lifetime,
}

/// A token and the 1-based line it starts on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Token {
    pub(crate) tok: Tok,
    pub(crate) line: usize,
}

impl Token {
    /// The identifier, if this is one.
    pub(crate) fn ident(&self) -> Option<&str> {
        match &self.tok {
            Tok::Ident(name) => Some(name),
            _ => None,
        }
    }

    /// Whether this is the punctuation `c`.
    pub(crate) fn is(&self, c: char) -> bool {
        self.tok == Tok::Punct(c)
    }
}

fn is_ident_start(c: char) -> bool {
    c == '_' || c.is_alphabetic()
}

fn is_ident_continue(c: char) -> bool {
    c == '_' || c.is_alphanumeric()
}

/// The source's tokens. Unterminated literals and comments run to the end of the text.
pub(crate) fn lex(src: &str) -> Vec<Token> {
    let s: Vec<char> = src.chars().collect();
    let at = |i: usize| s.get(i).copied();
    let mut out = Vec::new();
    let mut line = 1;
    let mut i = 0;
    while i < s.len() {
        let c = s[i];
        let start = line;
        let mut push = |tok| out.push(Token { tok, line: start });
        if c == '\n' {
            line += 1;
            i += 1;
        } else if c.is_whitespace() {
            i += 1;
        } else if c == '/' && at(i + 1) == Some('/') {
            while i < s.len() && s[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && at(i + 1) == Some('*') {
            i = block_comment(&s, i, &mut line);
        } else if c == '"' {
            i = string(&s, i + 1, &mut line);
            push(Tok::Literal);
        } else if c == '\'' {
            let (end, tok) = quote(&s, i);
            i = end;
            push(tok);
        } else if c.is_ascii_digit() {
            while at(i).is_some_and(is_ident_continue) {
                i += 1;
            }
            push(Tok::Literal);
        } else if is_ident_start(c) {
            let mut j = i;
            while at(j).is_some_and(is_ident_continue) {
                j += 1;
            }
            let word: String = s[i..j].iter().collect();
            let hashes = s[j..].iter().take_while(|&&h| h == '#').count();
            match (word.as_str(), at(j)) {
                ("r" | "br" | "cr", Some('#' | '"')) if at(j + hashes) == Some('"') => {
                    i = raw_string(&s, j + hashes + 1, hashes, &mut line);
                    push(Tok::Literal);
                }
                ("r", Some('#')) if at(j + 1).is_some_and(is_ident_start) => {
                    let mut k = j + 1;
                    while at(k).is_some_and(is_ident_continue) {
                        k += 1;
                    }
                    push(Tok::Ident(s[j + 1..k].iter().collect()));
                    i = k;
                }
                ("b" | "c", Some('"')) => {
                    i = string(&s, j + 1, &mut line);
                    push(Tok::Literal);
                }
                ("b", Some('\'')) => {
                    let (end, _) = quote(&s, j);
                    i = end;
                    push(Tok::Literal);
                }
                _ => {
                    push(Tok::Ident(word));
                    i = j;
                }
            }
        } else if c == ':' && at(i + 1) == Some(':') {
            push(Tok::PathSep);
            i += 2;
        } else {
            push(Tok::Punct(c));
            i += 1;
        }
    }
    out
}

/// The index after the block comment opening at `i`, which may nest.
fn block_comment(s: &[char], mut i: usize, line: &mut usize) -> usize {
    let mut depth = 0;
    while i < s.len() {
        match (s[i], s.get(i + 1)) {
            ('/', Some('*')) => {
                depth += 1;
                i += 2;
            }
            ('*', Some('/')) => {
                depth -= 1;
                i += 2;
                if depth == 0 {
                    return i;
                }
            }
            (c, _) => {
                *line += usize::from(c == '\n');
                i += 1;
            }
        }
    }
    i
}

/// The index after the closing quote of a string whose body starts at `i`.
fn string(s: &[char], mut i: usize, line: &mut usize) -> usize {
    while i < s.len() {
        match s[i] {
            '\\' => {
                *line += usize::from(s.get(i + 1) == Some(&'\n'));
                i += 2;
            }
            '"' => return i + 1,
            c => {
                *line += usize::from(c == '\n');
                i += 1;
            }
        }
    }
    i
}

/// The index after a raw string whose body starts at `i` and ends in `"` and `hashes` `#`.
fn raw_string(s: &[char], mut i: usize, hashes: usize, line: &mut usize) -> usize {
    while i < s.len() {
        if s[i] == '"' && s[i + 1..].iter().take(hashes).filter(|&&h| h == '#').count() == hashes {
            return i + 1 + hashes;
        }
        *line += usize::from(s[i] == '\n');
        i += 1;
    }
    i
}

/// At a `'`: a char literal (`'x'`, `'\n'`, `'\u{1F600}'`, `'\''`) or a lifetime or label.
fn quote(s: &[char], i: usize) -> (usize, Tok) {
    if s.get(i + 1) == Some(&'\\') {
        // An escape: the closing quote is the first `'` after the escaped character.
        let mut j = i + 3;
        while j < s.len() && s[j] != '\'' {
            j += 1;
        }
        return (j + 1, Tok::Literal);
    }
    if s.get(i + 2) == Some(&'\'') {
        return (i + 3, Tok::Literal);
    }
    let mut j = i + 1;
    while s.get(j).is_some_and(|&c| is_ident_continue(c)) {
        j += 1;
    }
    (j, Tok::Lifetime)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn idents(src: &str) -> Vec<String> {
        lex(src).into_iter().filter_map(|t| t.ident().map(str::to_string)).collect()
    }

    #[test]
    fn comments_and_literals_hide_paths() {
        let src = r####"
            // crate::line
            /// crate::doc
            //! crate::inner
            /* crate::block /* crate::nested */ crate::still */
            let a = "crate::string \" crate::escaped";
            let b = r#"crate::raw " crate::raw"#;
            let c = br##"crate::"#raw"##;
            let d = b"crate::bytes";
            let e = c"crate::c";
            let f = '"'; let g = '\''; let h = b'"'; let i = '\u{22}';
            keep
        "####;
        let words = idents(src);
        assert!(!words.iter().any(|w| w == "crate"), "{words:?}");
        assert_eq!(words.last().map(String::as_str), Some("keep"));
    }

    #[test]
    fn lifetimes_are_not_chars() {
        // If `'a` opened a char, `crate` would be swallowed up to the next quote.
        let toks = lex("fn f<'a>(x: &'a str) -> &'a str { crate::g(x) } 'outer: loop {}");
        let words: Vec<&str> = toks.iter().filter_map(Token::ident).collect();
        assert!(words.contains(&"crate") && words.contains(&"loop"), "{words:?}");
        assert_eq!(toks.iter().filter(|t| t.tok == Tok::Lifetime).count(), 4);
    }

    #[test]
    fn lines_count_inside_comments_and_strings() {
        let toks = lex("a\n/* x\ny */ \"p\nq\" r#\"\n\"# b\n'\\n' c");
        let lines: Vec<(String, usize)> =
            toks.iter().filter_map(|t| t.ident().map(|w| (w.to_string(), t.line))).collect();
        assert_eq!(lines, [("a".into(), 1), ("b".into(), 5), ("c".into(), 6)]);
    }

    #[test]
    fn raw_identifiers_and_path_separators() {
        let toks = lex("r#type::x");
        assert_eq!(toks[0].tok, Tok::Ident("type".into()));
        assert_eq!(toks[1].tok, Tok::PathSep);
    }
}
