--[[
nuro's job_submit bridge (Slurm 22.05, job_submit/lua). Admin guide: docs/job_submit.md.

Thin by design: every decision reads the generated policy table nuro_policy.lua (nuro.policy.luatable, written by
`nuro-admin policy apply` beside slurm.conf), and the same rules exist in Python (nuro.policy.admission), checked
against this file by the shared vectors in tests/vectors/admission.json through real sbatch. Change a rule in both.

Per submission: one dofile of the table (slurmctld has no stat() in Lua 5.1, and re-reading keeps `policy apply`
effective at once), then O(1) table lookups and one O(size) scan of the comment. Rules, in order (first failure
wins):
  1 account_other_team  2 qos_other_team / qos_no_team  2b qos_borrow  3 tier_denied  4 gpu_cap
  5a comment_not_canonical  5b preempt_forged  5 pin_changed (modify)  6 pin_invalid  7 pin_team
  8 pin_required (only with require_pinning)
The comment is read by `scan` below: a nuro record only in the canonical form nuro.protocol.jobcomment reads (the one parser
of every nuro component), so this bridge and the Python readers never see different records.
  then for team jobs: default QOS g-<team> and account <team>, requeue forced on; for 2..leaf_nodes nodes without
  --switches/--segment, the table's topology_hint: "switches" (topology/tree) req_switch=1 with
  wait4switch=switch_wait_s (a hint that never blocks longer than that); "segment" (topology/block, Slurm 25.11.2+)
  segment_size = the job's fixed node count; "none" nothing.

Fail operational: without a readable table (missing, syntax error, other format) jobs pass unchanged and each
submission logs an error; Slurm's QOS limits still hold. A Lua runtime error here also lets the job through
(slurmctld ignores the failed call), so the rules are wrapped in pcall to log it with our prefix.

Version notes (22.05.8, src/plugins/job_submit/lua/job_submit_lua.c, src/lua/slurm_lua.c):
  * Debian's plugin links Lua 5.1: `unpack`, not `table.unpack`; no integer subtype (numbers are doubles).
  * slurm.log_user is string.format(...): always pass "%s", msg so a '%' in a name cannot break it.
  * log_user in slurm_job_modify is discarded (an error in slurmctld's log; works from 23.02): scontrol update users
    see only the code's text, e.g. "Access/permission denied"; our log_info line has the reason. 23.02 fixed this
    (SchedMD bug 14539) in the release that also exported every ESLURM_* code to Lua (bug 14500), so the presence of
    slurm.ESLURM_INVALID_QOS tells the script that a modify may speak to the user (MODIFY_LOG_USER). Measured on
    24.11 and 26.05: scontrol update then prints our message above the code's text.
  * unset numbers are NO_VAL / NO_VAL16; "gres" is an alias of tres_per_node (read only if tres_per_node is nil).
  * only a few ESLURM_* codes are exported to Lua (no ESLURM_INVALID_QOS); the table names the one per rule.
  * the script is reloaded when its mtime (1 s resolution) is newer than the loaded copy's.
]]

-- 23.02+: log_user from slurm_job_modify reaches the user (see the version notes above).
local MODIFY_LOG_USER = slurm.ESLURM_INVALID_QOS ~= nil
local TABLE_FILE = "nuro_policy.lua"
local TABLE_FORMAT = 1
-- slurmctld loads us with luaL_loadfile(<dir of slurm.conf>/job_submit.lua): our chunk name is "@<that path>".
local TABLE_PATH = ((debug.getinfo(1, "S").source or ""):match("^@(.*/)[^/]*$") or "./") .. TABLE_FILE

local function load_policy()
	local ok, P = pcall(dofile, TABLE_PATH)
	if not ok then
		return nil, tostring(P)
	end
	if type(P) ~= "table" or P.format ~= TABLE_FORMAT then
		return nil, "format is " .. tostring(type(P) == "table" and P.format) .. ", this script reads " .. TABLE_FORMAT
	end
	return P
end

-- A number field that was given, or nil for Slurm's "unset" markers.
local function given(v)
	if type(v) ~= "number" or v == slurm.NO_VAL or v == slurm.NO_VAL16 or v == slurm.INFINITE then
		return nil
	end
	return v
end

-- GPUs in a TRES list: "gres:gpu:8", "gpu:a100:2", "gres:gpu:2,gres:mps:100" (no count = 1). Mirrors gpu_count().
local function gpus_in(spec)
	local n = 0
	for item in string.gmatch(spec or "", "[^,]+") do
		local name, rest = item:gsub("^gres[:/]", ""):match("^([^:=]+)(.*)$")
		if name == "gpu" then
			n = n + (tonumber(rest:match("[:=](%d+)$")) or 1)
		end
	end
	return n
end

-- The job comment, read by a strict scanner of nuro's canonical JSON (the form nuro.protocol.jobcomment.canonical writes:
-- compact, keys sorted by code point and never repeated, ASCII with lower-case \u escapes, integers of at most 15
-- digits, at most 1024 bytes and 32 levels). One left-to-right pass, O(size): a comment is a record only in that
-- form, exactly when Python's nuro.protocol.jobcomment.record() says so, and scan() gives the same first problem in the same
-- words as nuro.protocol.jobcomment.scan (its line-by-line mirror); tests/vectors/comment.json and the property tests
-- (tests/unit/test_comment_bridge.py under lua5.1, tests/integration/isolation/test_comment_parse.py through real
-- sbatch) hold the two to 0 disagreements. An object is { [raw key] = value, [SPANS] = { [raw key] = first byte of
-- the value * 65536 + its last byte }, [COUNT] = member count } (numeric slots never meet a string key); a string
-- value is STR (its text lies inside its span: in canonical form a string without a backslash is exactly its text),
-- anything else OTHER.
-- MAX_BYTES: Slurm's own cap on a job comment (1024, root included): the run record may use it all, nothing is
-- appended after submit (nuro.protocol.jobcomment.MAX_COMMENT_BYTES); SHORTEN_HINT is its SHORTEN_HINT.
local MAX_BYTES, MAX_DEPTH, MAX_DIGITS = 1024, 32, 15
local SHORTEN_HINT = "shorten the run name, the code repo path or the entry's arguments"
local STR_SPECIAL = '[%z\1-\31"\\\127-\255]' -- anything but printable ASCII without " and \
local NAMED = { [34] = 34, [92] = 92, [98] = 8, [102] = 12, [110] = 10, [114] = 13, [116] = 9 } -- " \ b f n r t
local SPACE = { [32] = true, [9] = true, [10] = true, [13] = true }
local B_OPEN, B_CLOSE, A_OPEN, A_CLOSE, QUOTE, COLON, COMMA, MINUS, BSL = 123, 125, 91, 93, 34, 58, 44, 45, 92
local STR, OTHER, SPANS, COUNT = { t = "s" }, { t = "x" }, 1, 2
local sbyte, ssub, sfind, schar = string.byte, string.sub, string.find, string.char

local function fail(why)
	error({ why = why }, 0)
end

local function at(i)
	return "at byte " .. i
end

local function unexpected(c, i)
	local b = sbyte(c, i)
	if not b then
		return "it ends early"
	end
	if SPACE[b] then
		return "a space or line break " .. at(i) .. " (the canonical form has none)"
	end
	if b <= 32 or b > 126 then
		return "a character outside printable ASCII " .. at(i)
	end
	return "unexpected '" .. schar(b) .. "' " .. at(i)
end

local function key_text(raw)
	return #raw <= 40 and raw or (ssub(raw, 1, 37) .. "...")
end

-- A key's UTF-16 units as code points: a high surrogate followed by a low one is one character (as json.loads reads).
local function code_points(units)
	local out, k, n = {}, 1, #units
	while k <= n do
		local a, b = units[k], units[k + 1]
		if a >= 0xD800 and a <= 0xDBFF and b and b >= 0xDC00 and b <= 0xDFFF then
			out[#out + 1] = 0x10000 + (a - 0xD800) * 1024 + (b - 0xDC00)
			k = k + 2
		else
			out[#out + 1] = a
			k = k + 1
		end
	end
	return out
end

local function as_points(key) -- a key without escapes is kept as its text; compare() needs code points for mixes
	if type(key) == "table" then
		return key
	end
	return { sbyte(key, 1, -1) }
end

-- Code point order, as Python compares str. Byte by byte, never `<` on strings (that is strcoll: locale order).
local function compare(a, b)
	if type(a) == "string" and type(b) == "string" then
		if a == b then
			return 0
		end
		for k = 1, math.min(#a, #b) do
			local x, y = sbyte(a, k), sbyte(b, k)
			if x ~= y then
				return x < y and -1 or 1
			end
		end
		return #a < #b and -1 or 1
	end
	a, b = as_points(a), as_points(b)
	for k = 1, math.min(#a, #b) do
		if a[k] ~= b[k] then
			return a[k] < b[k] and -1 or 1
		end
	end
	if #a == #b then
		return 0
	end
	return #a < #b and -1 or 1
end

-- The string literal at i: the index after it, and (for keys) the key to compare: its text, or with escapes its
-- code points.
local function scan_string(c, i, want_key)
	local j, units = i + 1, nil
	while true do
		local k = sfind(c, STR_SPECIAL, j)
		if not k then
			fail("a string " .. at(i) .. " that never ends")
		end
		local ch = sbyte(c, k)
		if ch == QUOTE then
			if not want_key then
				return k + 1
			end
			if not units then
				return k + 1, ssub(c, i + 1, k - 1)
			end
			for p = j, k - 1 do
				units[#units + 1] = sbyte(c, p)
			end
			return k + 1, code_points(units)
		end
		if ch ~= BSL then
			fail("a character outside printable ASCII " .. at(k) .. " (write it as a \\u escape)")
		end
		if want_key then
			units = units or {}
			for p = j, k - 1 do
				units[#units + 1] = sbyte(c, p)
			end
		end
		local e = sbyte(c, k + 1)
		if not e then
			fail("a string " .. at(i) .. " that never ends")
		end
		if e == 117 then -- u
			local hex = ssub(c, k + 2, k + 5)
			if not sfind(hex, "^[0-9a-fA-F][0-9a-fA-F][0-9a-fA-F][0-9a-fA-F]$") then
				fail("a bad \\u escape " .. at(k))
			end
			if sfind(hex, "[A-F]") then
				fail("an upper-case \\u escape " .. at(k) .. " (nuro writes lower case)")
			end
			local v = tonumber(hex, 16)
			if (v >= 0x20 and v <= 0x7E) or v == 8 or v == 9 or v == 10 or v == 12 or v == 13 then
				fail("a needless escape \\u" .. hex .. " " .. at(k) .. " (write the character itself or its short escape)")
			end
			if units then
				units[#units + 1] = v
			end
			j = k + 6
		elseif NAMED[e] then
			if units then
				units[#units + 1] = NAMED[e]
			end
			j = k + 2
		else
			fail("the escape \\" .. ((e > 32 and e <= 126) and schar(e) or "?") .. " " .. at(k) .. " (not in the canonical form)")
		end
	end
end

local function scan_number(c, i)
	local s, e = sfind(c, "^%-?[0-9]+", i)
	if not s then
		fail(unexpected(c, i))
	end
	local nxt = sbyte(c, e + 1)
	if nxt == 46 or nxt == 101 or nxt == 69 then -- . e E
		fail("a number " .. at(i) .. " that is not a whole number (nuro writes integers only)")
	end
	local first = sbyte(c, s) == MINUS and s + 1 or s
	if e > first and sbyte(c, first) == 48 then
		fail("a number with a leading zero " .. at(i))
	end
	if first > s and e == first and sbyte(c, first) == 48 then
		fail("minus zero " .. at(i))
	end
	if e - first + 1 > MAX_DIGITS then
		fail("a number of more than " .. MAX_DIGITS .. " digits " .. at(i))
	end
	return e + 1
end

local scan_value

local function scan_object(c, i, depth)
	if depth > MAX_DEPTH then
		fail("nesting deeper than " .. MAX_DEPTH .. " levels " .. at(i))
	end
	local spans, n = {}, 0
	local obj = { [SPANS] = spans, [COUNT] = 0 }
	i = i + 1
	if sbyte(c, i) == B_CLOSE then
		return i + 1, obj
	end
	local prev, prev_raw
	while true do
		if sbyte(c, i) ~= QUOTE then
			fail(unexpected(c, i))
		end
		local key_at, key = i, nil
		i, key = scan_string(c, i, true)
		local raw = type(key) == "string" and key or ssub(c, key_at + 1, i - 2)
		if prev then
			local order = compare(prev, key)
			if order == 0 then
				fail('key "' .. key_text(raw) .. '" given twice ' .. at(key_at))
			end
			if order > 0 then
				fail('key "' .. key_text(raw) .. '" ' .. at(key_at) .. ' is out of order (after "' .. key_text(prev_raw) .. '")')
			end
		end
		prev, prev_raw = key, raw
		if sbyte(c, i) ~= COLON then
			fail(unexpected(c, i))
		end
		local first, v = i + 1, nil
		i, v = scan_value(c, first, depth)
		obj[raw], spans[raw], n = v, first * 65536 + i - 1, n + 1
		local ch = sbyte(c, i)
		if ch == B_CLOSE then
			obj[COUNT] = n
			return i + 1, obj
		end
		if ch ~= COMMA then
			fail(unexpected(c, i))
		end
		i = i + 1
	end
end

local function scan_array(c, i, depth)
	if depth > MAX_DEPTH then
		fail("nesting deeper than " .. MAX_DEPTH .. " levels " .. at(i))
	end
	i = i + 1
	if sbyte(c, i) == A_CLOSE then
		return i + 1, OTHER
	end
	while true do
		i = scan_value(c, i, depth)
		local ch = sbyte(c, i)
		if ch == A_CLOSE then
			return i + 1, OTHER
		end
		if ch ~= COMMA then
			fail(unexpected(c, i))
		end
		i = i + 1
	end
end

local WORDS = { [116] = "true", [102] = "false", [110] = "null" }

scan_value = function(c, i, depth)
	local b = sbyte(c, i)
	if not b then
		fail("it ends early")
	end
	if b == QUOTE then
		return scan_string(c, i, false), STR
	elseif b == B_OPEN then
		return scan_object(c, i, depth + 1)
	elseif b == A_OPEN then
		return scan_array(c, i, depth + 1)
	elseif b == MINUS or (b >= 48 and b <= 57) then
		return scan_number(c, i), OTHER
	end
	local w = WORDS[b]
	if w and ssub(c, i, i + #w - 1) == w then
		return i + #w, OTHER
	end
	fail(unexpected(c, i))
end

-- The comment's top object when it is canonical, else nil and the first problem (nuro.protocol.jobcomment.scan's words).
local function scan(c)
	if #c > MAX_BYTES then
		return nil, "it is " .. #c .. " bytes, " .. (#c - MAX_BYTES) .. " over the " .. MAX_BYTES
			.. " Slurm allows in a job comment (" .. SHORTEN_HINT .. ")"
	end
	if c == "" then
		return nil, "it is empty"
	end
	if sbyte(c, 1) ~= B_OPEN then
		return nil, "it does not start with {"
	end
	local ok, e, obj = pcall(scan_value, c, 1, 0)
	if not ok then
		if type(e) == "table" then
			return nil, e.why
		end
		error(e, 0)
	end
	if e <= #c then
		return nil, "text after the closing } " .. at(e)
	end
	return obj
end

-- What the rules read from a comment (mirror of nuro.policy.admission.read_comment): nil without a comment and for
-- plain text; { why = problem } for a comment that looks like a record (starts with "{" or holds "nuro":) but is not
-- canonical; else { nuro = pins or nil, preempt = '"preempt":<value>' or nil }. pins = { raw = '"nuro":{...}',
-- bad = first invalid field (P.pin_fields), team, digest, name, commit }.
local HEX40 = string.rep("[0-9a-f]", 40)
local DIGEST, COMMIT = "^sha256:" .. HEX40 .. string.rep("[0-9a-f]", 24) .. "$", "^" .. HEX40 .. "$"

local function read_comment(c)
	if type(c) ~= "string" or c == "" then
		return nil
	end
	local top, why = scan(c)
	if not top then
		if sbyte(c, 1) == B_OPEN or sfind(c, '"nuro":', 1, true) then
			return { why = why }
		end
		return nil
	end
	local function text(parent, key, inner) -- the value's bytes (inside the quotes with inner)
		local span = parent[SPANS][key]
		local first, last = math.floor(span / 65536), span % 65536
		return inner and ssub(c, first + 1, last - 1) or ssub(c, first, last)
	end
	local function raw(key)
		return top[key] ~= nil and ('"' .. key .. '":' .. text(top, key)) or nil
	end
	local function obj_of(parent, key)
		local v = parent[key]
		return type(v) == "table" and v[SPANS] and v or nil
	end
	local function str_of(parent, key)
		return parent[key] == STR and text(parent, key, true) or nil
	end
	local view = { preempt = raw("preempt") }
	if top.nuro == nil then
		return view
	end
	local rec = { raw = raw("nuro") }
	view.nuro = rec
	local n = obj_of(top, "nuro")
	if not n then
		rec.bad = "nuro"
		return view
	end
	local d, code = obj_of(n, "dataset"), obj_of(n, "code")
	if d and d[COUNT] == 2 and str_of(d, "digest") and str_of(d, "name") then
		rec.digest, rec.name = str_of(d, "digest"), str_of(d, "name")
	end
	rec.commit = code and str_of(code, "commit")
	rec.team = str_of(n, "team")
	if not rec.digest then
		rec.bad = "nuro.dataset"
	elseif not rec.digest:find(DIGEST) then
		rec.bad = "nuro.dataset.digest"
	elseif #rec.name > 63 or not rec.name:find("^[a-z0-9][a-z0-9._%-]*$") then
		rec.bad = "nuro.dataset.name"
	elseif not (rec.commit and rec.commit:find(COMMIT)) then
		rec.bad = "nuro.code.commit"
	elseif not rec.team or #rec.team > 31 or not rec.team:find("^[a-z][a-z0-9_]*$") then
		rec.bad = "nuro.team"
	end
	return view
end

-- A field of the update d, else of the job record r (nil at submit).
local function field(d, r, k)
	local v = d[k]
	if v == nil and r then
		v = r[k]
	end
	return v
end

-- GPUs the job asks for, from every field they can arrive in (d: the request or update, r: the job record or nil).
local function gpus_of(d, r)
	-- A node count in the update (NumNodes=) replaces the record's; the upper end counts.
	local nodes = given(d.max_nodes) or given(d.min_nodes) or (r and (given(r.max_nodes) or given(r.min_nodes)))
	nodes = math.max(nodes or 1, 1)
	local tasks = given(d.num_tasks) or (given(d.ntasks_per_node) and given(d.ntasks_per_node) * nodes) or nodes
	local per_node = field(d, r, "tres_per_node") or field(d, r, "gres")
	return math.max(
		gpus_in(field(d, r, "tres_per_job")),
		gpus_in(per_node) * nodes,
		gpus_in(field(d, r, "tres_per_task")) * tasks,
		gpus_in(field(d, r, "tres_per_socket")) * (given(d.sockets_per_node) or 1) * nodes
	), nodes
end

-- The job as the rules see it. On modify (r = job record) unchanged fields come from the record; the user is the
-- modifier when they own the job (job records carry no user name in 22.05), else unknown (nil).
local function view(P, d, r, uid)
	local function str(k)
		return field(d, r, k)
	end
	local function num(k)
		return given(d[k]) or (r and given(r[k]))
	end
	local j = { account = str("account"), qos = str("qos"), switches = num("req_switch") }
	-- segment_size: 25.11.2+ (nil on older Slurm, where the field is unknown); 0 is "none asked"
	if (num("segment_size") or 0) > 0 then
		j.segment = num("segment_size")
	end
	if not r or d.user_id == r.user_id then
		j.user = d.user_name
	end
	j.label = r and ("job_id=" .. tostring(r.job_id)) or ("job=" .. tostring(d.name))
	j.uid = uid
	local own = j.user and P.users[j.user]
	if j.account then
		j.team = P.teams[j.account] and j.account or nil
	else
		j.team = own
	end
	j.own_team = own
	j.gpus, j.nodes = gpus_of(d, r)
	j.cv = read_comment(str("comment"))
	j.rec = j.cv and j.cv.nuro
	j.comment_given = d.comment ~= nil -- on modify a comment the update leaves alone is not judged again
	-- a QOS this submission or update chooses (an update that repeats the job's QOS chooses nothing)
	j.new_qos = d.qos
	if r and d.qos == r.qos then
		j.new_qos = nil
	end
	if r then -- modify: what the job had before this update
		j.old_cv, j.old_gpus = read_comment(r.comment), gpus_of({}, r)
		j.old_rec = j.old_cv and j.old_cv.nuro
	end
	return j
end

local function reject(P, rule, ...)
	local r = P.rules[rule]
	return slurm[r.code] or slurm.ESLURM_ACCESS_DENIED, rule, string.format(r.message, ...)
end

-- Rule 1: a team member may not charge another team's account.
local function check_account(P, j)
	if j.own_team and j.account and j.account ~= j.own_team and P.teams[j.account] then
		return reject(P, "account_other_team", j.user, j.own_team, j.account, j.own_team)
	end
end

-- Rule 2: g-<team> / b-<team> only for that team's jobs.
local function check_qos_team(P, j)
	local owner = j.qos and P.qos_team[j.qos]
	if owner and owner ~= j.team then
		if j.team then
			local default = P.teams[j.team].guaranteed_qos
			return reject(P, "qos_other_team", j.qos, owner, j.team, j.team, default)
		end
		local who = j.user or ("uid " .. tostring(j.uid))
		return reject(P, "qos_no_team", j.qos, owner, who, who, owner)
	end
end

-- Rule 2b: b-<team> is where the controller (root) moves a team's pending jobs within the lending limits; a user
-- who chose it directly would skip them. On modify only an update that changes the QOS to it is judged.
local function check_borrow_qos(P, j)
	local owner = j.new_qos and P.qos_team[j.new_qos]
	if owner and P.teams[owner].borrow_qos == j.new_qos and P.rules.qos_borrow then
		return reject(P, "qos_borrow", j.new_qos, owner, owner, P.teams[owner].guaranteed_qos)
	end
end

-- Rule 3: tier QOS (urgent, ...) only for the listed accounts or users.
local function check_tier(P, j)
	local tier = j.qos and P.tiers[j.qos]
	local account = j.account or j.team
	if tier and not ((j.user and tier.users[j.user]) or (account and tier.accounts[account])) then
		local acct_text = account and ("account " .. account) or "no account given"
		local who = j.user or ("uid " .. tostring(j.uid))
		return reject(P, "tier_denied", j.qos, tier.who, who, acct_text, j.qos, j.qos)
	end
end

-- Rule 4: never more GPUs in one job than the team's quota + borrowing limit.
local function check_gpus(P, j)
	local t = j.team and P.teams[j.team]
	if t and j.gpus > t.max_gpus then
		return reject(P, "gpu_cap", j.team, t.max_gpus, t.quota_gpus, t.borrow_limit_gpus, j.gpus)
	end
end

-- Rules 5-8: the nuro record (pins) in the comment. A record must be valid and for the job's team even when pinning
-- is not required; on modify it can never change (only the channel keys beside it); with require_pinning a team job
-- that asks for GPUs needs one (on modify: when the update raises its GPUs, so a CPU job cannot become a GPU job).
local function check_pins(P, j)
	local rec = j.rec
	-- Rules 5a/5b: a comment that looks like a record must be one (else every reader ignores it), and only the
	-- controller writes preempt marks: a user may not add, change or drop one (on submit: none at all).
	if P.rules.comment_not_canonical then
		if j.cv and j.cv.why and j.comment_given then
			return reject(P, "comment_not_canonical", j.cv.why)
		end
		if (j.cv and j.cv.preempt) ~= (j.old_cv and j.old_cv.preempt) then
			return reject(P, "preempt_forged")
		end
	end
	if not P.pin_fields then -- a table written before these rules (same format: the keys were only added)
		return
	end
	if j.old_rec and (not rec or rec.raw ~= j.old_rec.raw) then
		return reject(P, "pin_changed")
	end
	if rec and rec.bad then
		return reject(P, "pin_invalid", rec.bad, P.pin_fields[rec.bad], j.team or "<team>")
	end
	local charged = j.account or j.team
	if rec and rec.team ~= charged then
		local text = charged and ("account " .. charged) or "your default account, which is no team"
		return reject(P, "pin_team", rec.team, text, rec.team)
	end
	if P.require_pinning and not rec and j.team and j.gpus > 0 and (j.old_gpus or 0) < j.gpus then
		return reject(P, "pin_required", j.team, j.team)
	end
end

local CHECKS = { check_account, check_qos_team, check_borrow_qos, check_tier, check_gpus, check_pins }

-- Team jobs are always requeueable (preemption and failure recovery requeue them). On modify: only a change to 0.
local function force_requeue(d, j, modifying)
	if j.team and d.requeue ~= 1 and not (modifying and given(d.requeue) == nil) then
		d.requeue = 1
		return "requeue=1"
	end
end

-- Evaluate the checks, then (submit only) apply the team defaults and the switch hint.
local function admit(P, d, j, modifying)
	for _, check in ipairs(CHECKS) do
		local code, rule, msg = check(P, j)
		if code then
			if not modifying or MODIFY_LOG_USER then
				slurm.log_user("%s", msg)
			end
			slurm.log_info("nuro: reject %s uid=%s user=%s rule=%s code=%s policy=%s: %s", j.label, tostring(j.uid),
				tostring(j.user), rule, P.rules[rule].code, string.sub(P.digest, 8, 19), msg)
			return code
		end
	end
	local changes = {}
	if j.team and not modifying then
		if not j.qos then
			d.qos = P.teams[j.team].guaranteed_qos
			table.insert(changes, "qos=" .. d.qos)
		end
		if not j.account then
			d.account = j.team
			table.insert(changes, "account=" .. j.team)
		end
	end
	local requeue = force_requeue(d, j, modifying)
	if requeue then
		table.insert(changes, requeue)
	end
	-- Topology hint (admission rule 7): one leaf for a gang that fits one. tree: req_switch=1 waiting at most
	-- switch_wait_s; block (a Lua that can set segment_size): the whole job one segment, for a fixed node count only.
	local hint = P.topology_hint or "switches"
	if not modifying and not j.switches and not j.segment and j.nodes >= 2 and j.nodes <= P.leaf_nodes then
		if hint == "switches" then
			d.req_switch = 1
			d.wait4switch = P.switch_wait_s
			table.insert(changes, "switches=1@" .. P.switch_wait_s .. "s")
		elseif hint == "segment" and given(d.min_nodes) == j.nodes then
			d.segment_size = j.nodes
			table.insert(changes, "segment=" .. j.nodes)
		end
	end
	slurm.log_debug("nuro: accept %s uid=%s user=%s team=%s gpus=%d set=%s", j.label, tostring(j.uid),
		tostring(j.user), tostring(j.team), j.gpus, table.concat(changes, ","))
	return slurm.SUCCESS
end

local function run(hook, d, r, uid)
	-- Root (admins, nuro-controller moving jobs between QOS) is let through first, as Slurm's example does: never
	-- locked out by a bad table. Trade-off: a job submitted as root is not judged, so reproduce user errors as
	-- the user (runuser -u <user> -- sbatch ...), not as root.
	if uid == 0 then
		return slurm.SUCCESS
	end
	local P, err = load_policy()
	if not P then
		slurm.log_error("nuro: %s uid=%s: no usable policy table %s (%s); job passes unchanged", hook,
			tostring(uid), TABLE_PATH, err)
		return slurm.SUCCESS
	end
	local ok, rc = pcall(function()
		return admit(P, d, view(P, d, r, uid), r ~= nil)
	end)
	if not ok then
		slurm.log_error("nuro: %s uid=%s: internal error, job passes unchanged: %s", hook, tostring(uid), tostring(rc))
		return slurm.SUCCESS
	end
	return rc
end

function slurm_job_submit(job_desc, part_list, submit_uid)
	return run("submit", job_desc, nil, submit_uid)
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
	return run("modify", job_desc, job_rec, modify_uid)
end

slurm.log_info("nuro: job_submit.lua loaded; policy table %s", TABLE_PATH)
return slurm.SUCCESS
