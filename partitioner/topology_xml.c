/* A small XML reader (elements, attributes, character data; comments, the
 * prolog and DOCTYPE skipped) for hwloc and NCCL topology files, so both load
 * without hwloc and every error names the file and line. Also the growing
 * text buffer the writers use. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cdp/core.h"
#include "partitioner/topology_internal.h"

#define XML_MAX_DEPTH 256

void cdp_buf_printf(struct cdp_buf *b, const char *fmt, ...)
{
    if (b->failed) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        size_t room = b->cap - b->n;
        int n = vsnprintf(b->p ? b->p + b->n : NULL, b->p ? room : 0, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->failed = 1;
            return;
        }
        if (b->p && (size_t)n < room) {
            b->n += (size_t)n;
            return;
        }
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->n + (size_t)n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->failed = 1;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
}

void cdp_buf_escaped(struct cdp_buf *b, const char *s)
{
    for (; *s; s++) {
        switch (*s) {
        case '&': cdp_buf_printf(b, "&amp;"); break;
        case '<': cdp_buf_printf(b, "&lt;"); break;
        case '>': cdp_buf_printf(b, "&gt;"); break;
        case '"': cdp_buf_printf(b, "&quot;"); break;
        default:
            if ((unsigned char)*s < 0x20 && *s != '\t' && *s != '\n') cdp_buf_printf(b, " ");
            else cdp_buf_printf(b, "%c", *s);
        }
    }
}

void cdp_xml_free(struct cdp_xml *x)
{
    if (!x) return;
    for (int i = 0; i < x->n_kids; i++) cdp_xml_free(x->kids[i]);
    for (int i = 0; i < 2 * x->n_attrs; i++) free(x->attrs[i]);
    free(x->attrs);
    free(x->kids);
    free(x->name);
    free(x->text);
    free(x);
}

const char *cdp_xml_attr(const struct cdp_xml *x, const char *name)
{
    for (int i = 0; i < x->n_attrs; i++)
        if (strcmp(x->attrs[2 * i], name) == 0) return x->attrs[2 * i + 1];
    return NULL;
}

struct xp {
    const char *s, *end, *name;
    int line;
};

static cdp_status xfail(const struct xp *p, const char *fmt, ...) CDP_PRINTF(2, 3);
static cdp_status xfail(const struct xp *p, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return cdp_fail(CDP_ERR_INVALID, "%s: line %d: %s", p->name, p->line, msg);
}

static void adv(struct xp *p, size_t n)
{
    for (size_t i = 0; i < n && p->s < p->end; i++, p->s++)
        if (*p->s == '\n') p->line++;
}

static int starts(const struct xp *p, const char *lit)
{
    size_t n = strlen(lit);
    return (size_t)(p->end - p->s) >= n && memcmp(p->s, lit, n) == 0;
}

static int skip_past(struct xp *p, const char *lit)
{
    size_t n = strlen(lit);
    while (p->s < p->end) {
        if ((size_t)(p->end - p->s) >= n && memcmp(p->s, lit, n) == 0) {
            adv(p, n);
            return 1;
        }
        adv(p, 1);
    }
    return 0;
}

static int is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
static int is_name(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '-' || c == '.' || c == ':' || (unsigned char)c >= 0x80;
}

static void skip_space(struct xp *p)
{
    while (p->s < p->end && is_space(*p->s)) adv(p, 1);
}

/* Decodes entities of [a, b) into a new string. */
static char *decode(const struct xp *p, const char *a, const char *b, cdp_status *st)
{
    char *out = malloc((size_t)(b - a) + 1), *o = out;
    if (!out) {
        *st = cdp_fail(CDP_ERR_NOMEM, "%s: out of memory", p->name);
        return NULL;
    }
    while (a < b) {
        if (*a != '&') {
            *o++ = *a++;
            continue;
        }
        const char *semi = memchr(a, ';', (size_t)(b - a));
        size_t n = semi ? (size_t)(semi - a) : 0;
        if (!semi || n > 12) goto bad;
        if (n == 4 && !memcmp(a, "&amp", 4)) *o++ = '&';
        else if (n == 3 && !memcmp(a, "&lt", 3)) *o++ = '<';
        else if (n == 3 && !memcmp(a, "&gt", 3)) *o++ = '>';
        else if (n == 5 && !memcmp(a, "&quot", 5)) *o++ = '"';
        else if (n == 5 && !memcmp(a, "&apos", 5)) *o++ = '\'';
        else if (n >= 3 && a[1] == '#') {
            long c = a[2] == 'x' ? strtol(a + 3, NULL, 16) : strtol(a + 2, NULL, 10);
            if (c <= 0 || c > 0x10ffff) goto bad;
            if (c < 0x80) *o++ = (char)c;
            else *o++ = '?'; /* names and values we read are ASCII */
        } else {
            goto bad;
        }
        a = semi + 1;
    }
    *o = '\0';
    return out;
bad:
    free(out);
    *st = xfail(p, "bad character reference \"%.12s\"", a);
    return NULL;
}

static cdp_status add_text(struct cdp_xml *x, const char *s, size_t n)
{
    if (x->text_len + n + 1 > x->text_cap) {
        size_t cap = x->text_cap ? x->text_cap * 2 : 64;
        while (cap < x->text_len + n + 1) cap *= 2;
        char *t = realloc(x->text, cap);
        if (!t) return cdp_fail(CDP_ERR_NOMEM, "out of memory");
        x->text = t;
        x->text_cap = cap;
    }
    memcpy(x->text + x->text_len, s, n);
    x->text_len += n;
    x->text[x->text_len] = '\0';
    return CDP_OK;
}

static cdp_status add_kid(struct cdp_xml *parent, struct cdp_xml *kid)
{
    if (parent->n_kids == parent->cap_kids) {
        int cap = parent->cap_kids ? parent->cap_kids * 2 : 4;
        struct cdp_xml **k = realloc(parent->kids, (size_t)cap * sizeof *k);
        if (!k) return cdp_fail(CDP_ERR_NOMEM, "out of memory");
        parent->kids = k;
        parent->cap_kids = cap;
    }
    parent->kids[parent->n_kids++] = kid;
    kid->parent = parent;
    return CDP_OK;
}

/* Reads "<name attr="v" ...>" or ".../>" at p (after '<'). */
static cdp_status read_start_tag(struct xp *p, struct cdp_xml **out, int *empty)
{
    cdp_status st = CDP_OK;
    const char *a = p->s;
    while (p->s < p->end && is_name(*p->s)) adv(p, 1);
    if (p->s == a) return xfail(p, "expected an element name after '<'");
    struct cdp_xml *x = calloc(1, sizeof *x);
    if (!x || !(x->name = strndup(a, (size_t)(p->s - a)))) {
        cdp_xml_free(x);
        return cdp_fail(CDP_ERR_NOMEM, "%s: out of memory", p->name);
    }
    x->line = p->line;
    for (;;) {
        skip_space(p);
        if (p->s >= p->end) {
            st = xfail(p, "the file ends inside the tag <%s>", x->name);
            goto fail;
        }
        if (*p->s == '>') {
            adv(p, 1);
            *empty = 0;
            break;
        }
        if (starts(p, "/>")) {
            adv(p, 2);
            *empty = 1;
            break;
        }
        const char *n0 = p->s;
        while (p->s < p->end && is_name(*p->s)) adv(p, 1);
        if (p->s == n0) {
            st = xfail(p, "unexpected '%c' in the tag <%s>", *p->s, x->name);
            goto fail;
        }
        size_t nlen = (size_t)(p->s - n0);
        skip_space(p);
        if (p->s >= p->end || *p->s != '=') {
            st = xfail(p, "attribute \"%.*s\" of <%s> has no value", (int)nlen, n0, x->name);
            goto fail;
        }
        adv(p, 1);
        skip_space(p);
        if (p->s >= p->end || (*p->s != '"' && *p->s != '\'')) {
            st = xfail(p, "attribute \"%.*s\" of <%s>: expected a quoted value", (int)nlen, n0, x->name);
            goto fail;
        }
        char q = *p->s;
        adv(p, 1);
        const char *v0 = p->s;
        while (p->s < p->end && *p->s != q) adv(p, 1);
        if (p->s >= p->end) {
            st = xfail(p, "the file ends inside an attribute value of <%s>", x->name);
            goto fail;
        }
        const char *v1 = p->s;
        adv(p, 1);
        char **attrs = realloc(x->attrs, (size_t)(x->n_attrs + 1) * 2 * sizeof *attrs);
        if (!attrs) {
            st = cdp_fail(CDP_ERR_NOMEM, "%s: out of memory", p->name);
            goto fail;
        }
        x->attrs = attrs;
        attrs[2 * x->n_attrs] = strndup(n0, nlen);
        attrs[2 * x->n_attrs + 1] = decode(p, v0, v1, &st);
        x->n_attrs++;
        if (!attrs[2 * x->n_attrs - 2] || !attrs[2 * x->n_attrs - 1]) {
            if (!st) st = cdp_fail(CDP_ERR_NOMEM, "%s: out of memory", p->name);
            goto fail;
        }
    }
    *out = x;
    return CDP_OK;
fail:
    cdp_xml_free(x);
    return st;
}

cdp_status cdp_xml_parse(const char *text, size_t len, const char *name, struct cdp_xml **root)
{
    struct xp p = {.s = text, .end = text + len, .name = name, .line = 1};
    struct cdp_xml *stack[XML_MAX_DEPTH];
    int depth = 0;
    struct cdp_xml *top = NULL;
    cdp_status st = CDP_OK;
    if (starts(&p, "\xef\xbb\xbf")) adv(&p, 3);
    while (p.s < p.end) {
        if (*p.s != '<') {
            const char *a = p.s;
            while (p.s < p.end && *p.s != '<') adv(&p, 1);
            if (depth > 0) {
                char *t = decode(&p, a, p.s, &st);
                if (!t) goto fail;
                st = add_text(stack[depth - 1], t, strlen(t));
                free(t);
                if (st) goto fail;
            } else {
                for (const char *c = a; c < p.s; c++)
                    if (!is_space(*c)) {
                        st = xfail(&p, "text outside the root element");
                        goto fail;
                    }
            }
            continue;
        }
        int line0 = p.line;
        if (starts(&p, "<?")) {
            if (!skip_past(&p, "?>")) {
                p.line = line0;
                st = xfail(&p, "the file ends inside a <?...?> declaration");
                goto fail;
            }
        } else if (starts(&p, "<!--")) {
            if (!skip_past(&p, "-->")) {
                p.line = line0;
                st = xfail(&p, "the file ends inside a comment");
                goto fail;
            }
        } else if (starts(&p, "<![CDATA[")) {
            adv(&p, 9);
            const char *a = p.s;
            if (!skip_past(&p, "]]>") || depth == 0) {
                p.line = line0;
                st = xfail(&p, depth ? "the file ends inside CDATA" : "CDATA outside the root element");
                goto fail;
            }
            if ((st = add_text(stack[depth - 1], a, (size_t)(p.s - 3 - a)))) goto fail;
        } else if (starts(&p, "<!")) {
            int nest = 0;
            adv(&p, 2);
            while (p.s < p.end && !(*p.s == '>' && nest == 0)) {
                if (*p.s == '[') nest++;
                if (*p.s == ']') nest--;
                adv(&p, 1);
            }
            if (p.s >= p.end) {
                p.line = line0;
                st = xfail(&p, "the file ends inside a <!...> declaration");
                goto fail;
            }
            adv(&p, 1);
        } else if (starts(&p, "</")) {
            adv(&p, 2);
            const char *a = p.s;
            while (p.s < p.end && is_name(*p.s)) adv(&p, 1);
            size_t n = (size_t)(p.s - a);
            skip_space(&p);
            if (p.s >= p.end || *p.s != '>') {
                st = xfail(&p, "the file ends inside a closing tag");
                goto fail;
            }
            adv(&p, 1);
            if (depth == 0) {
                st = xfail(&p, "closing tag </%.*s> with no element open", (int)n, a);
                goto fail;
            }
            struct cdp_xml *open = stack[depth - 1];
            if (strlen(open->name) != n || memcmp(open->name, a, n)) {
                st = xfail(&p, "closing tag </%.*s> does not match <%s> opened at line %d", (int)n, a,
                           open->name, open->line);
                goto fail;
            }
            depth--;
        } else {
            adv(&p, 1);
            struct cdp_xml *x = NULL;
            int empty = 0;
            if ((st = read_start_tag(&p, &x, &empty))) goto fail;
            if (depth == 0) {
                if (top) {
                    st = xfail(&p, "a second root element <%s> after <%s>", x->name, top->name);
                    cdp_xml_free(x);
                    goto fail;
                }
                top = x;
            } else if ((st = add_kid(stack[depth - 1], x))) {
                cdp_xml_free(x);
                goto fail;
            }
            if (!empty) {
                if (depth == XML_MAX_DEPTH) {
                    st = xfail(&p, "elements nested deeper than %d", XML_MAX_DEPTH);
                    goto fail;
                }
                stack[depth++] = x;
            }
        }
    }
    if (depth > 0) {
        st = cdp_fail(CDP_ERR_INVALID, "%s: line %d: the file ends before <%s> (opened at line %d) is closed: "
                      "truncated?", name, p.line, stack[depth - 1]->name, stack[depth - 1]->line);
        goto fail;
    }
    if (!top) {
        st = cdp_fail(CDP_ERR_INVALID, "%s: no XML element in the file", name);
        goto fail;
    }
    *root = top;
    return CDP_OK;
fail:
    cdp_xml_free(top);
    return st;
}
