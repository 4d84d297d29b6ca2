"""The op-mention count (``tools/op_mentions.py``): which modules outside an op's folder name it.

    pytest tools/test_op_mentions.py -q
"""

from __future__ import annotations

from _scripts import ROOT, load, tree

om = load("op_mentions", ROOT / "tools" / "op_mentions.py")
CORE_SRC = ROOT / "core" / "src"


FIXTURE = {
    "pkg/__init__.py": "",
    "pkg/ops/__init__.py": "",
    "pkg/ops/norm/__init__.py": 'OP = "norm"\n',  # inside its own folder: not counted for norm
    "pkg/ops/norm/kernel.py": "def norm(x):\n    return x\n",
    "pkg/ops/mask/__init__.py": "",
    # comments and docstrings only: not counted
    "pkg/quiet.py": '''
        """This module is about norm."""
        # norm, norm, norm
        def f():
            """The norm, again."""
            x = 1  # norm
            "norm"
            return x
        class C:
            """norm"""
    ''',
    # a string literal without whitespace that holds the word: counted; prose (whitespace) is not
    "pkg/strings.py": '''
        FIELD = "norm_implementation"
        REF = "pkg.ops.norm.kernel:norm"
        TEXT = """one line
        and norm here"""
        call("x", "norm")
        raise ValueError(f"{x}: the norm is wrong")
        key = f"{x}:norm"
    ''',
    # a name: counted; a name that merely contains the op's: not
    "pkg/names.py": '''
        from .ops import norm
        mask_mask = 1
        attention_mask = norm
        normal = "normal abnorm norms"
    ''',
    "pkg/unrelated.py": 'mask_size = 3\nprint("masks")\n',
    # not a package: the template tree is not counted
    "pkg/template/tool.py": 'NAME = "norm"\n',
}


def test_comments_and_docstrings_do_not_count_strings_and_names_do(tmp_path):
    root = tree(tmp_path, FIXTURE)
    found = om.mentions(root)
    assert set(found) == {"norm", "mask"}
    # "norm_implementation" is one word, so the first line does not count; TEXT and the message
    # are prose; REF, the call and the f-string key count
    assert found["norm"] == {"pkg/strings.py": 3, "pkg/names.py": 2}
    assert found["mask"] == {}  # mask_mask, mask_size and "masks" merely contain it


def test_the_table_names_each_file_with_its_lines(tmp_path, capsys):
    root = tree(tmp_path, FIXTURE)
    assert om.main([str(root)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines() == [  # ops by folder name; files by lines, most first
        "mask: 0 file(s) outside its folder",
        "norm: 2 file(s) outside its folder",
        "    pkg/strings.py  3 line(s)",
        "    pkg/names.py  2 line(s)",
    ]


def test_max_fails_naming_the_op_over_it(tmp_path, capsys):
    root = tree(tmp_path, FIXTURE)
    assert om.main([str(root), "--max", "2"]) == 0
    assert om.main([str(root), "--max", "1"]) == 1
    err = capsys.readouterr().err
    assert "op norm is named in 2 modules outside its folder, more than --max 1" in err
    assert "mask" not in err


def test_the_core_ops_are_all_counted():
    found = om.mentions(CORE_SRC)
    assert {"rms_norm", "attention", "moe_experts"} <= set(found)
    # the template tree under new_backend/ is not a package: never counted
    assert not any("backend-template" in path for files in found.values() for path in files)
