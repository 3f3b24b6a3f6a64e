"""The dashboard's door: sign-in, tenants in URLs, roles, another tenant's pages."""

from django.test import Client

from tenants.people import member_add

from .conftest import PASSWORD, person, signed_in


def test_a_signed_out_visitor_is_sent_to_the_login_page(acme):
    response = Client().get("/t/acme/runs")
    assert response.status_code == 302 and response["Location"].startswith("/login?next=/t/acme/runs")


def test_login_takes_the_email_in_any_case_and_lands_on_the_only_tenant(acme):
    user = person(acme, "viewer")
    client = Client()
    response = client.post("/login", {"username": f"  {user.username.upper()} ",
                                      "password": PASSWORD})
    assert response.status_code == 302
    assert client.get("/")["Location"] == "/t/acme/runs"
    assert client.get("/t/acme/runs").status_code == 200


def test_a_wrong_password_is_refused_with_the_form_again(acme):
    user = person(acme, "viewer")
    response = Client().post("/login", {"username": user.username, "password": "nope"})
    assert response.status_code == 200 and b"Please enter a correct" in response.content


def test_another_tenants_pages_and_unknown_tenants_are_404(acme, globex):
    client = signed_in(person(acme, "owner"))
    assert client.get("/t/globex/runs").status_code == 404
    assert client.get("/t/nosuch/runs").status_code == 404


def test_a_person_in_two_tenants_picks_and_switches(acme, globex):
    user = person(acme, "viewer")
    member_add(tenant=globex, email=user.username, role="operator", by="test")
    client = signed_in(user)
    home = client.get("/")
    assert home.status_code == 200 and b"/t/acme/runs" in home.content and b"/t/globex/runs" in home.content
    assert client.get("/?tenant=globex")["Location"] == "/t/globex/runs"
    assert client.get("/?tenant=nosuch").status_code == 200  # not theirs: the picker again
    page = client.get("/t/globex/runs")
    assert page.status_code == 200 and b"operator" in page.content


def test_passwords_are_stored_with_argon2(acme):
    assert person(acme, "viewer").password.startswith("argon2$argon2id$")

