(* A long-lived type checker and bytecode compiler built on compiler-libs: one process compiles every
   completion of a worker, so no compiler start-up is paid per completion, and it keeps going past
   errors, which lets it count independent errors (ocamlc stops at the first).

   Argument: the one folder of the load path (the stdlib's interfaces and Tally's).
   Request on stdin: a line "DIR MODULE FUNCTION" with the byte sizes of three texts, then the texts: the
   problem's definitions, the completion's solution, the tests. Reply, one line of tab-separated fields:
   syntax_errors, type_errors, definitions, definitions_ok, compiled (0/1), tests_total, the tests' line
   of each assertion (comma-separated), error_sample, syntax_repairs, repaired_type_errors. The last two
   say, for a solution that does not parse, how many single-token edits (1 to max_repairs) made it parse,
   0 when none did within max_repairs, and how many independent type errors the repaired text has; both
   are 0 when it parses. The repaired text is only graded: nothing of it is compiled or run.

   The unit compiled to DIR/module.cmo is [Tally.seal (); types; module Solution (_ : sig end) = struct
   code end; harness; tests]. When it does not compile, the completion is typed one top-level definition
   at a time: a failing definition is left out, and errors that only say a left-out name is unbound are
   not counted again.
   The completion sits in a functor so that its top-level effects run only when the harness applies
   it, and the harness, defined after it, is out of its reach. [Tally.seal] comes first: the runner's
   child removes the unit from the file system before any other code of it runs (ocaml/runner.ml).
   The unit holds the tests' expected values (never their source text), so it is written 0600 (the
   parent starts the checker with umask 077) under a name the parent draws at random. The line of each
   assertion goes to the parent in the reply, for its logs.

   Errors name the file as the parent describes it: "solution.ml" is the completion's code as scored
   (the problem's signature line first where the completion had none), "tests.ml" the tests,
   "problem.ml" the problem's definitions; never the worker's folder. *)

open Parsetree

let message_of exn =
  match Location.error_of_exn exn with
  | Some (`Ok report) ->
      let text = Format.asprintf "%t" report.Location.main.txt in
      let start = report.Location.main.loc.Location.loc_start in
      ((start.Lexing.pos_fname, start.Lexing.pos_lnum), text)
  | _ -> (("", 0), Printexc.to_string exn)

(* Only our three file names: a location elsewhere (the harness, the unit as a whole) is not shown. *)
let sample ((file, line), text) =
  if line > 0 && List.mem file [ "solution.ml"; "tests.ml"; "problem.ml" ] then
    Printf.sprintf "File \"%s\", line %d: %s" file line text
  else text

let parse name text =
  let lexbuf = Lexing.from_string text in
  Location.init lexbuf name;
  Parse.implementation lexbuf

let rec pattern_names acc p =
  match p.ppat_desc with
  | Ppat_var name -> name.txt :: acc
  | Ppat_alias (p, name) -> pattern_names (name.txt :: acc) p
  | Ppat_constraint (p, _) | Ppat_lazy p | Ppat_open (_, p) | Ppat_exception p -> pattern_names acc p
  | Ppat_construct (_, Some (_, p)) | Ppat_variant (_, Some p) -> pattern_names acc p
  | Ppat_tuple ps | Ppat_array ps -> List.fold_left pattern_names acc ps
  | Ppat_record (fields, _) -> List.fold_left (fun acc (_, p) -> pattern_names acc p) acc fields
  | Ppat_or (a, b) -> pattern_names (pattern_names acc a) b
  | _ -> acc

let constructor_names td =
  match td.ptype_kind with
  | Ptype_variant cds -> List.map (fun cd -> cd.pcd_name.txt) cds
  | Ptype_record lds -> List.map (fun ld -> ld.pld_name.txt) lds
  | _ -> []

(* Every name an item binds, so that errors cascading from a left-out item can be recognised. *)
let bound_names item =
  match item.pstr_desc with
  | Pstr_value (_, vbs) -> List.fold_left (fun acc vb -> pattern_names acc vb.pvb_pat) [] vbs
  | Pstr_primitive vd -> [ vd.pval_name.txt ]
  | Pstr_type (_, tds) -> List.concat_map (fun td -> td.ptype_name.txt :: constructor_names td) tds
  | Pstr_exception te -> [ te.ptyexn_constructor.pext_name.txt ]
  | Pstr_module { pmb_name = { txt = Some name; _ }; _ } -> [ name ]
  | Pstr_recmodule mbs -> List.filter_map (fun mb -> mb.pmb_name.txt) mbs
  | _ -> []

let unbound_kinds = [ "Unbound value "; "Unbound constructor "; "Unbound type constructor "; "Unbound module " ]

let cascades left_out text =
  let first_line = List.hd (String.split_on_char '\n' text) in
  List.exists
    (fun prefix ->
      let n = String.length prefix in
      String.length first_line > n
      && String.sub first_line 0 n = prefix
      &&
      let name = String.sub first_line n (String.length first_line - n) in
      let last = List.hd (List.rev (String.split_on_char '.' name)) in
      List.mem last left_out)
    unbound_kinds

(* Types the items one at a time; returns (errors, definitions that typed, first error). *)
let count_type_errors env items =
  let rec loop env items left_out errors ok first =
    match items with
    | [] -> (errors, ok, first)
    | item :: rest -> (
        let snapshot = Btype.snapshot () in
        match Typemod.type_structure env [ item ] with
        | _, _, _, env' ->
            Typecore.force_delayed_checks ();
            loop env' rest left_out errors (ok + 1) first
        | exception exn ->
            Btype.backtrack snapshot;
            Typecore.reset_delayed_checks ();
            let line, text = message_of exn in
            let left_out' = bound_names item @ left_out in
            if cascades left_out text then loop env rest left_out' errors ok first
            else
              let first = if first = None then Some (line, text) else first in
              loop env rest left_out' (errors + 1) ok first)
  in
  loop env items [] 0 0 None

let lid text = Location.mknoloc (Parse.longident (Lexing.from_string text))

(* Each assertion of the tests becomes [Tally.check tally_token i (fun () -> assertion)]; also returns
   the line of each, for the parent's logs. *)
let instrument_tests tests =
  let count = ref 0 in
  let lines = ref [] in
  let open Ast_helper in
  let rec rewrite e =
    match e.pexp_desc with
    | Pexp_sequence (a, b) ->
        let a = rewrite a in
        { e with pexp_desc = Pexp_sequence (a, rewrite b) }
    | Pexp_let (flag, vbs, body) -> { e with pexp_desc = Pexp_let (flag, vbs, rewrite body) }
    | Pexp_assert _ ->
        incr count;
        lines := e.pexp_loc.Location.loc_start.Lexing.pos_lnum :: !lines;
        let thunk = Exp.fun_ Asttypes.Nolabel None (Pat.construct (lid "()") None) e in
        Exp.apply
          (Exp.ident (lid "Tally.check"))
          [
            (Asttypes.Nolabel, Exp.ident (lid "tally_token"));
            (Asttypes.Nolabel, Exp.constant (Const.int !count));
            (Asttypes.Nolabel, thunk);
          ]
    | _ -> e
  in
  let item i =
    match i.pstr_desc with
    | Pstr_value (flag, vbs) ->
        { i with pstr_desc = Pstr_value (flag, List.map (fun vb -> { vb with pvb_expr = rewrite vb.pvb_expr }) vbs) }
    | Pstr_eval (e, attrs) -> { i with pstr_desc = Pstr_eval (rewrite e, attrs) }
    | _ -> i
  in
  let items = List.map item tests in
  (items, !count, List.rev !lines)

let seal = Parse.implementation (Lexing.from_string "let () = Tally.seal ()\n")

let harness fname =
  Parse.implementation
    (Lexing.from_string
       (Printf.sprintf
          "let tally_token = Tally.take ()\nmodule Solution_instance = Solution (struct end)\nlet %s = Solution_instance.%s\n"
          fname fname))

let solution_functor code =
  let open Ast_helper in
  Str.module_
    (Mb.mk (Location.mknoloc (Some "Solution"))
       (Mod.functor_ (Named (Location.mknoloc None, Mty.signature [])) (Mod.structure code)))

(* Compile_common.with_info would also reset the load path, and with it the cache of loaded interfaces:
   reading stdlib.cmi again would cost more than the whole compilation. *)
let compile_unit dir modname ast =
  let output_prefix = Filename.concat dir (String.uncapitalize_ascii modname) in
  Env.set_unit_name modname;
  let info =
    {
      (* Typing looks for an interface beside it: the module's name is random, nothing a completion
         could plant in the folder beforehand. *)
      Compile_common.source_file = output_prefix ^ ".ml";
      module_name = modname;
      output_prefix;
      env = Compmisc.initial_env ();
      ppf_dump = Format.err_formatter;
      tool_name = "ocamlc";
      native = false;
    }
  in
  let typed = Compile_common.typecheck_impl info ast in
  Compile.emit_bytecode info (Compile.to_bytecode info typed)

let clean text = String.map (fun c -> if c = '\t' || c = '\n' || c = '\r' then ' ' else c) text

let reply fields =
  print_string (String.concat "\t" fields ^ "\n");
  flush stdout

let numbers = List.map string_of_int
let line_list lines = String.concat "," (numbers lines)

let failure ?(repairs = (0, 0)) syntax_errors type_errors definitions ok total lines error =
  let repaired, repaired_errors = repairs in
  reply
    (numbers [ syntax_errors; type_errors; definitions; ok; 0; total ]
    @ [ line_list lines; clean (sample error) ]
    @ numbers [ repaired; repaired_errors ])

(* --- How close a solution that does not parse is to parsing ------------------------------------------

   Greedy, at most max_repairs single-token edits, each at the current syntax error (a lexer error too):
   delete the token that starts there, when it is one of [deletable] (for a lexer error: the illegal
   character, the quote of an unterminated string, the opening of an unterminated comment), insert one of
   [inserted] before it, or insert [in] before the first token of the line of the token before it (a
   missing [in] shows only at the end of the text or at the next definition, a line after the place it
   belongs). An edit after which the text parses ends the search; otherwise the edit whose next error is
   furthest on, strictly after the current one in the text as it was, is kept, and the search goes on
   from there. Names, literals and other punctuation are never deleted, so that Python's [:] or the words
   of prose cannot be edited away. At most max_repairs x 15 parses of the solution, after its own. *)

let max_repairs = 3
let inserted = [ "in"; ")"; "]"; "}"; "end"; "done"; "then"; "do"; "with"; "->"; "="; "|"; ";" ]
let deletable = "rec" :: ";;" :: inserted

type parsed = Parses of structure | Error_at of int | Unplaced

let parse_status text =
  match parse "solution.ml" text with
  | items -> Parses items
  | exception exn -> (
      match Location.error_of_exn exn with
      | Some (`Ok report) -> Error_at report.Location.main.loc.Location.loc_start.Lexing.pos_cnum
      | _ -> Unplaced)

(* The (start, end, lexed) offsets of the tokens of [text] from offset [from], in order, while they start
   before [limit]; a lexer error ends the list as a token of its own extent, with lexed = false. *)
let tokens ?(limit = max_int) text from =
  let lexbuf = Lexing.from_string (String.sub text from (String.length text - from)) in
  Lexer.init ();
  let rec next acc =
    match Lexer.token lexbuf with
    | Parser.EOF -> List.rev acc
    | _ ->
        let start = from + lexbuf.Lexing.lex_start_p.Lexing.pos_cnum in
        if start >= limit then List.rev acc
        else next ((start, from + lexbuf.Lexing.lex_curr_p.Lexing.pos_cnum, true) :: acc)
    | exception Lexer.Error (_, loc) ->
        let start = from + loc.Location.loc_start.Lexing.pos_cnum in
        let stop = ref (max (start + 1) (from + loc.Location.loc_end.Lexing.pos_cnum)) in
        (* An illegal character of several bytes (UTF-8) goes whole. *)
        while !stop < String.length text && Char.code text.[!stop] land 0xC0 = 0x80 do incr stop done;
        if start >= limit then List.rev acc else List.rev ((start, !stop, false) :: acc)
  in
  next []

(* Each edit at the error at [at]: the edited text, and where an offset of it was in [text]. *)
let edits text at =
  let length = String.length text in
  let insert site token =
    let added = String.length token + 2 in
    ( String.sub text 0 site ^ " " ^ token ^ " " ^ String.sub text site (length - site),
      fun q -> if q >= site + added then q - added else min q site )
  in
  let line_site =
    match List.rev (tokens ~limit:at text 0) with
    | [] -> []
    | ((previous, _, _) :: _) as before ->
        let line = match String.rindex_from_opt text previous '\n' with Some i -> i + 1 | None -> 0 in
        (* [before] runs backwards: the last start on the line is the line's first token. *)
        let first = List.fold_left (fun first (start, _, _) -> if start >= line then start else first) at before in
        if first < at then [ first ] else []
  in
  let deletion =
    match tokens ~limit:(at + 1) text at with
    | (start, stop, lexed) :: _ when start = at && ((not lexed) || List.mem (String.sub text at (stop - at)) deletable)
      ->
        let removed = stop - at in
        let origin q = if q >= at then q + removed else q in
        [ (String.sub text 0 at ^ String.sub text stop (length - stop), origin) ]
    | _ -> []
  in
  deletion @ List.map (insert at) inserted @ List.map (fun site -> insert site "in") line_site

(* (edits, the repaired items) when at most max_repairs edits make [text] parse. *)
let repair text =
  let rec search text at count =
    let rec try_edits best = function
      | [] -> `Best best
      | (edited, origin) :: rest -> (
          match parse_status edited with
          | Parses items -> `Parsed items
          | Unplaced -> try_edits best rest
          | Error_at q ->
              let further = origin q in
              let best =
                match best with
                | Some (_, _, b) when b >= further -> best
                | _ when further > at -> Some (edited, q, further)
                | _ -> best
              in
              try_edits best rest)
    in
    match try_edits None (edits text at) with
    | `Parsed items -> Some (count, items)
    | `Best (Some (edited, q, _)) when count < max_repairs -> search edited q (count + 1)
    | `Best _ -> None
  in
  match parse_status text with Error_at at -> search text at 1 | Parses _ | Unplaced -> None

(* (edits, independent type errors of the repaired text), (0, 0) when it cannot be repaired: then, and
   on any failure here, the solution earns what a syntax error always earned. *)
let repairs types code_src =
  try
    match repair code_src with
    | None -> (0, 0)
    | Some (count, items) ->
        let _, _, _, env = Typemod.type_structure (Compmisc.initial_env ()) types in
        let errors, _, _ = count_type_errors env items in
        (count, errors)
  with _ -> (0, 0)

(* Compile first: most completions that get this far are whole; only a failure pays for counting. *)
let check dir modname fname types_src code_src tests_src =
  Env.set_unit_name modname;
  let types = parse "problem.ml" types_src in
  match parse "solution.ml" code_src with
  | exception exn -> failure ~repairs:(repairs types code_src) 1 0 0 0 0 [] (message_of exn)
  | code -> (
      let tests, total, lines = instrument_tests (parse "tests.ml" tests_src) in
      let definitions = List.length code in
      let snapshot = Btype.snapshot () in
      match compile_unit dir modname (seal @ types @ [ solution_functor code ] @ harness fname @ tests) with
      | () -> reply (numbers [ 0; 0; definitions; definitions; 1; total ] @ [ line_list lines; "" ] @ numbers [ 0; 0 ])
      | exception compile_error -> (
          Btype.backtrack snapshot;
          Typecore.reset_delayed_checks ();
          let _, _, _, env = Typemod.type_structure (Compmisc.initial_env ()) types in
          match count_type_errors env code with
          | errors, ok, Some first -> failure 0 errors definitions ok total lines first
          | _, ok, None -> failure 0 0 definitions ok total lines (message_of compile_error)))

(* A request is "DIR MODULE FUNCTION TYPES_BYTES CODE_BYTES TESTS_BYTES", then those three texts. *)
let () =
  ignore (Warnings.parse_options false "-a");
  (match Sys.argv with
  | [| _; include_dir |] ->
      Clflags.no_std_include := true;
      Clflags.include_dirs := [ include_dir ]
  | _ -> ());
  Compmisc.init_path ();
  (* No .cmi per completion: nothing reads it, and writing it costs a tenth of a compilation. *)
  Clflags.dont_write_files := true;
  set_binary_mode_in stdin true;
  try
    while true do
      match String.split_on_char ' ' (input_line stdin) with
      | [ dir; modname; fname; n_types; n_code; n_tests ] -> (
          let types = really_input_string stdin (int_of_string n_types) in
          let code = really_input_string stdin (int_of_string n_code) in
          let tests = really_input_string stdin (int_of_string n_tests) in
          try check dir modname fname types code tests
          with exn ->
            reply [ "0"; "0"; "0"; "0"; "0"; "0"; ""; clean ("checker: " ^ snd (message_of exn)); "0"; "0" ])
      | _ -> reply [ "0"; "0"; "0"; "0"; "0"; "0"; ""; "checker: bad request"; "0"; "0" ]
    done
  with End_of_file -> ()
